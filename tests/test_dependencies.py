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


def test_a_torchscript_recipe_compiles_and_runs_without_tvm_tensorrt_or_the_cli(tmp_path) -> None:
    """A GPU machine with CUDA torch, numpy, onnx and onnxruntime only (scripts/gpu_check.sh's): no apache-tvm, no
    TensorRT, no typer / rich / matplotlib. The library compiles a torchscript-only recipe, loads it and runs it."""
    from tests.conftest import write_tiny_recipe

    recipe = write_tiny_recipe(tmp_path, backends="[torchscript]")
    absent = ("tvm", "tvm_ffi", "tensorrt", "typer", "rich", "matplotlib")
    code = (f"import sys\nfor name in {absent!r}:\n    sys.modules[name] = None\n"
            "import numpy as np\nimport rlopt\nfrom rlopt.compile import compile_recipe\n"
            "from rlopt.compile.cache import StageCache\n"
            f"result = compile_recipe({str(recipe)!r}, {str(tmp_path / 'out')!r}, cache=StageCache(enabled=False))\n"
            "assert result.passed, result.failures\n"
            "with rlopt.load(result.model_dir, 'policy') as session:\n"
            "    print(session.run({'input0': np.zeros((2, 3, 32), np.float32)})['logits'].shape)\n"
            f"print(sorted(name for name in {absent!r} if sys.modules.get(name) is not None))\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split("\n")[:2] == ["(2, 3, 5)", "[]"]


def test_the_gpu_extra_brings_what_tvm_cuda_needs_at_load() -> None:
    """TVM-CUDA libraries compile their kernels when they load (NVRTC through cuda-bindings): the `gpu` extra installs
    both, for the CUDA 12 builds of torch, onnxruntime-gpu and TensorRT."""
    import tomllib
    from pathlib import Path

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]
    gpu = project["optional-dependencies"]["gpu"]
    tvm_pin = next(d for d in project["dependencies"] if d.startswith("apache-tvm=="))
    assert f"apache-tvm[cuda]{tvm_pin.removeprefix('apache-tvm')}" in gpu
    assert any(d.startswith("cuda-bindings") for d in gpu) and any(d.startswith("nvidia-cuda-nvrtc-cu12") for d in gpu)
