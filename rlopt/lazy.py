"""Heavy and optional modules come through `require`, so `rlopt --help` needs none of them."""

from __future__ import annotations

import functools
import importlib
import sys
import threading
from types import ModuleType

from rlopt.errors import BackendUnavailable

INSTALL_HINTS: dict[str, str] = {
    "onnxruntime": "pip install 'rlopt[cpu]' (or 'rlopt[gpu]' for onnxruntime-gpu, never both)",
    "tvm": "pip install 'apache-tvm==0.27.0.post1' 'apache-tvm-ffi==0.1.14.post1'",
    "tensorrt": "install TensorRT 10 or 11 from NVIDIA on a machine with an NVIDIA GPU",
    "torch": "pip install 'torch==2.13.0'",
    "onnx": "pip install onnx",
    "tritonclient": "pip install 'rlopt[serve]'",
}


# Libraries that load faster before torch: tvm_ffi imports torch ahead of itself (a workaround for a Windows
# symbol clash), and TVM's runtime-only import then raises 140 FFI errors for the compiler's absent types, the
# first of which has libbacktrace read the symbols of every loaded library, torch's too (0.7 s here).
LOAD_BEFORE_TORCH = frozenset({"tvm"})


def require(module: str) -> ModuleType:
    """Import `module` or raise BackendUnavailable naming the install command."""
    try:
        if module.split(".")[0] in LOAD_BEFORE_TORCH:
            return _import_before_torch(module)
        return importlib.import_module(module)
    except ImportError as exc:
        top = module.split(".")[0]
        hint = INSTALL_HINTS.get(top, f"pip install {top}")
        raise BackendUnavailable(
            f"module '{module}' is required but could not be imported ({exc}); fix: {hint}"
        ) from exc


def _import_before_torch(module: str) -> ModuleType:
    """Import `module` with `import torch` failing, when torch is not imported yet and no other thread could be
    importing it (the import's only use of torch is its torch-tensor exchange, which rlopt does not use)."""
    if module.split(".")[0] in sys.modules or "torch" in sys.modules or threading.active_count() > 1:
        return importlib.import_module(module)
    sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` raise ImportError
    try:
        return importlib.import_module(module)
    finally:
        if "torch" in sys.modules and sys.modules["torch"] is None:
            del sys.modules["torch"]


@functools.lru_cache(maxsize=None)
def version_of(distribution: str) -> str | None:
    """Installed version of a distribution, without importing it (read once per process: each stage's cache key
    asks for a dozen, and reading a distribution's metadata costs about 2 ms)."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(distribution)
    except PackageNotFoundError:
        return None


def module_version(module: str) -> str | None:
    """Version of the installed distribution that provides import name `module`, without importing it: `tensorrt`
    comes from `tensorrt`, `tensorrt-cu12`, `tensorrt-cu13` or their `-bindings` wheels, whichever is installed."""
    from importlib.metadata import packages_distributions
    from importlib.util import find_spec

    try:
        if find_spec(module) is None:
            return None
    except (ImportError, ValueError):
        return None
    plain = version_of(module)
    if plain is not None:
        return plain
    for distribution in packages_distributions().get(module, []):  # reads every installed RECORD: ~0.15 s
        found = version_of(distribution)
        if found is not None:
            return found
    return None
