"""Heavy and optional modules come through `require`, so `rlopt --help` needs none of them."""

from __future__ import annotations

import importlib
from types import ModuleType

from rlopt.errors import BackendUnavailable

INSTALL_HINTS: dict[str, str] = {
    "onnxruntime": "pip install 'rlopt[cpu]' (or 'rlopt[gpu]' for onnxruntime-gpu, never both)",
    "tvm": "pip install 'apache-tvm==0.27.0.post1' 'apache-tvm-ffi==0.1.14.post1'",
    "tensorrt": "install TensorRT 10 or 11 from NVIDIA on a machine with an NVIDIA GPU",
    "torch": "pip install 'torch==2.13.0'",
    "onnx": "pip install onnx",
}


def require(module: str) -> ModuleType:
    """Import `module` or raise BackendUnavailable naming the install command."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        hint = INSTALL_HINTS.get(top, f"pip install {top}")
        raise BackendUnavailable(
            f"module '{module}' is required but could not be imported ({exc}); fix: {hint}"
        ) from exc


def version_of(distribution: str) -> str | None:
    """Installed version of a distribution, without importing it."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None
