"""Backend knowledge has one home: outside rlopt/backends/, no module names a backend (issue 32). The generic layers
ask the backend's descriptor (rlopt.backends.capability.Backend) instead.

A name counts as a string constant equal to a registered backend's name, or an attribute named like one (a recipe
section read as `recipe.tvm`). Exceptions, each for one reason: the lazy-import table names libraries to install
(rlopt/lazy.py), the front end's ONNX Runtime module names the library it opens (rlopt/onnx_session.py), and TVM's
tuning is TVM's by definition (`rlopt tune`: rlopt/tools/tune/, and compile's `--tune-trials` flag), and a GPU's
identity holds TensorRT's version because contract section 11 defines it so (rlopt/machine.py, rlopt/facts.py)."""

from __future__ import annotations

import ast
from pathlib import Path

from rlopt.backends import BACKENDS

ROOT = Path(__file__).resolve().parents[1] / "rlopt"
EXEMPT_FILES = ("lazy.py", "onnx_session.py", "tools/tune/")
EXEMPT_NAMES = {("cli/build.py", "tvm"),  # --tune-trials: TVM's MetaSchedule budget, as a recipe override
                ("machine.py", "tensorrt"), ("facts.py", "tensorrt")}  # the GPU identity (contract section 11)


def backend_names(source: str, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) for every string constant equal to one of `names` and every attribute named like one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
            found.append((node.lineno, node.value))
        elif isinstance(node, ast.Attribute) and node.attr in names:
            found.append((node.lineno, node.attr))
    return found


def test_no_generic_module_names_a_backend() -> None:
    names = set(BACKENDS)
    bad = []
    for path in sorted(ROOT.rglob("*.py")):
        relative = path.relative_to(ROOT).as_posix()
        if relative.startswith("backends/") or relative.startswith(EXEMPT_FILES):
            continue
        bad += [f"rlopt/{relative}:{line}: {name}" for line, name in backend_names(path.read_text(), names)
                if (relative, name) not in EXEMPT_NAMES]
    assert bad == [], "\n".join(bad)


def test_the_scan_finds_a_name_compare_and_a_section_read() -> None:
    source = 'if backend == "tvm":\n    x = recipe.tensorrt\ny = "tvm thread"\n'
    assert backend_names(source, {"tvm", "tensorrt"}) == [(1, "tvm"), (2, "tensorrt")]


def test_a_backend_added_on_the_interface_lives_in_its_package_and_the_registry_line() -> None:
    """OpenVINO was added on the Backend interface alone: outside its package only the registry imports it."""
    elsewhere = sorted(f"rlopt/{path.relative_to(ROOT).as_posix()}" for path in ROOT.rglob("*.py")
                       if "openvino" in path.read_text().lower()
                       and not path.relative_to(ROOT).as_posix().startswith("backends/openvino/"))
    assert elsewhere == ["rlopt/backends/__init__.py"]
