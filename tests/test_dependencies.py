"""Every rlopt module imports, and `rlopt --help` runs, without torch, onnxruntime, tvm or tensorrt."""

from __future__ import annotations

import pkgutil
import subprocess
import sys

import rlopt

HEAVY = ("torch", "onnxruntime", "tvm", "tensorrt", "onnx")

BLOCK = "import sys\nfor name in {heavy!r}:\n    sys.modules[name] = None\n"


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", BLOCK.format(heavy=HEAVY) + code], capture_output=True, text=True,
                          timeout=120)


def test_every_module_imports_without_heavy_dependencies() -> None:
    names = [m.name for m in pkgutil.walk_packages(rlopt.__path__, "rlopt.") if m.name != "rlopt.__main__"]
    proc = _run(f"import importlib\nfor n in {names!r}:\n    importlib.import_module(n)\nprint('ok', len({names!r}))")
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith("ok")


def test_help_runs_without_heavy_dependencies() -> None:
    proc = _run("import sys\nsys.argv = ['rlopt', '--help']\nfrom rlopt.cli import main\nmain()")
    assert proc.returncode == 0, proc.stderr
    assert "compile" in proc.stdout


def test_missing_backend_module_is_one_clear_line() -> None:
    proc = _run("from rlopt.lazy import require\ntry:\n    require('tvm')\nexcept Exception as e:\n    print(e)")
    assert "module 'tvm' is required but could not be imported" in proc.stdout and "fix: pip install" in proc.stdout


def test_tvm_is_imported_before_torch_and_torch_imports_after() -> None:
    """`require('tvm')` in a process without torch keeps torch out (tvm_ffi would import it first, and TVM's first
    FFI error would then read torch's symbols); torch still imports and computes afterwards."""
    from importlib.util import find_spec

    if find_spec("tvm") is None:
        import pytest

        pytest.skip("apache-tvm is not installed")
    code = ("import sys\nfrom rlopt.lazy import require\ntvm = require('tvm')\n"
            "print('torch' in sys.modules, 'torch' in sys.modules and sys.modules['torch'] is None)\n"
            "import torch\nprint(float((torch.ones(3) * 2).sum()), tvm.runtime.tensor([1.0, 2.0]).numpy().sum())")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["False", "False", "6.0", "3.0"]
