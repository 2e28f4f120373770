"""Write the Python-visible names of TensorRT's bindings to tests/data/tensorrt_names_<major>.txt.

The tests' TensorRT stand-in (tests/tensorrt_standin.py) and every `trt.<name>` rlopt uses are checked against
these lists (tests/backends/test_tensorrt_names.py), so a name the real bindings lack fails here, not on a GPU.

The `tensorrt-cu12-bindings` wheel (about 1.2 MB) is downloaded, never installed: it does not import without
NVIDIA's libraries. pybind11 registers every class, method, property, argument and enum value by a string
literal that its code points at, so the names are the identifiers among the literals `tensorrt.so`'s code
references (`lea ...(%rip)` targets and relative relocations into .rodata, read with binutils' objdump and
readelf; plain `strings` misses names the linker merged into the tail of a longer literal, e.g. REFIT inside
INCLUDE_REFIT), plus what the wheel's `__init__.py` defines in Python (`nptype`, `volume`, `__version__`).

    python scripts/tensorrt_names.py --version 11.4.0.106      # pip download, then write the list
    python scripts/tensorrt_names.py --wheel path/to/tensorrt_cu12_bindings-....whl
"""

from __future__ import annotations

import argparse
import ast
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
IDENTIFIER = re.compile(rb"[A-Za-z_][A-Za-z0-9_]*")


def referenced_literals(library: Path) -> set[str]:
    """Identifiers among the NUL-terminated strings in .rodata that the library's code or data points at."""
    data = library.read_bytes()
    sections = subprocess.run(["readelf", "-S", "-W", str(library)], capture_output=True, text=True, check=True).stdout
    found = re.search(r"\]\s+\.rodata\s+PROGBITS\s+([0-9a-f]+)\s+([0-9a-f]+)\s+([0-9a-f]+)", sections)
    if found is None:
        raise SystemExit(f"{library}: no .rodata section")
    address, offset, size = (int(value, 16) for value in found.groups())
    disassembly = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(library)], capture_output=True,
                                 text=True, check=True).stdout
    relocations = subprocess.run(["readelf", "-r", "-W", str(library)], capture_output=True, text=True,
                                 check=True).stdout
    targets = {int(t, 16) for t in re.findall(r"lea\s+.*\(%rip\).*#\s*([0-9a-f]+)", disassembly)}
    targets |= {int(t, 16) for t in re.findall(r"R_X86_64_RELATIVE\s+([0-9a-f]+)", relocations)}
    names = set()
    for target in targets:
        if address <= target < address + size:
            start = offset + target - address
            literal = data[start:data.index(b"\0", start)]
            if IDENTIFIER.fullmatch(literal):
                names.add(literal.decode())
    return names


def python_names(init: Path) -> set[str]:
    """Names the package's __init__.py defines: top-level functions (and their parameters), classes and
    assignments, and attributes it sets on the bindings' classes (`DataType.itemsize = ...`)."""
    names = set()
    for node in ast.walk(ast.parse(init.read_text())):
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)) and node.col_offset == 0:
            names.add(node.name)
            if isinstance(node, ast.FunctionDef):
                names.update(argument.arg for argument in node.args.args)
        elif isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Name) and target.col_offset == 0:
                    names.add(target.id)
                elif isinstance(target, ast.Attribute):
                    names.add(target.attr)
    return {name for name in names if not name.startswith("_") or name == "__version__"}


def download(version: str, folder: Path) -> Path:
    subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"tensorrt-cu12-bindings=={version}",
                    "-d", str(folder)], check=True)
    return next(folder.glob("tensorrt_cu12_bindings-*.whl"))


def write_names(wheel: Path, out: Path | None) -> Path:
    with tempfile.TemporaryDirectory(prefix="trt-names-") as scratch, zipfile.ZipFile(wheel) as archive:
        archive.extractall(scratch)
        package = Path(scratch) / "tensorrt_bindings"
        version = re.search(r'__version__ = "([^"]+)"', (package / "__init__.py").read_text())
        if version is None:
            raise SystemExit(f"{wheel.name}: no __version__ in tensorrt_bindings/__init__.py")
        names = referenced_literals(package / "tensorrt.so") | python_names(package / "__init__.py")
    out = out or ROOT / "tests" / "data" / f"tensorrt_names_{version.group(1).split('.')[0]}.txt"
    header = [f"# Python-visible names of TensorRT {version.group(1)}'s bindings, from {wheel.name}",
              "# made by scripts/tensorrt_names.py: identifiers among the string literals tensorrt.so's code points",
              "# at (pybind11's names), plus the names its __init__.py defines; one name a line, sorted"]
    out.write_text("\n".join(header + sorted(names)) + "\n")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--version", help="tensorrt-cu12-bindings version to download, e.g. 11.4.0.106")
    source.add_argument("--wheel", type=Path, help="a downloaded tensorrt-cu12-bindings wheel")
    parser.add_argument("-o", "--out", type=Path, help="default: tests/data/tensorrt_names_<major>.txt")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="trt-wheel-") as folder:
        wheel = args.wheel or download(args.version, Path(folder))
        print(write_names(wheel, args.out))


if __name__ == "__main__":
    main()
