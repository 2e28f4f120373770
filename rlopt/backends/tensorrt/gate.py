"""Whether TensorRT can run here, and the libraries its code uses, loaded only after that check.

The GPU check comes before `tensorrt` is imported: the lean runtime segfaults when it deserializes without a GPU
(shared notes). The runner takes its device buffers, pinned host buffers and streams from torch, so a CPU build of
torch rules TensorRT out as well. Every caller goes through this module's attributes (`gate.load_tensorrt()`),
so the tests swap in a stand-in in one place.
"""

from __future__ import annotations

from importlib.util import find_spec
from types import ModuleType
from typing import Any, Callable

from rlopt.errors import BackendUnavailable, first_line
from rlopt.lazy import require
from rlopt.machine import gpu_absent_reason, torch_cuda_build


def unavailable_reason() -> str | None:
    """Why TensorRT cannot build or run here, checked without importing it or torch; None when it can."""
    reason = gpu_absent_reason()
    if reason is not None:
        return f"TensorRT needs an NVIDIA GPU: {reason}"
    try:
        installed = find_spec("tensorrt") is not None
    except (ImportError, ValueError):
        installed = False
    if not installed:
        return ("TensorRT needs the 'tensorrt' package (NVIDIA's wheels, e.g. pip install tensorrt-cu12 from "
                "NVIDIA's index), not installed here")
    if torch_cuda_build() is None:
        return ("the TensorRT runner takes its GPU buffers and streams from torch, and this torch is a CPU build "
                "(install a CUDA build of torch on the GPU machine)")
    return None


def load_tensorrt() -> ModuleType:
    return require("tensorrt")


def cuda_torch() -> ModuleType:
    """torch, with CUDA usable in this process (a failed CUDA initialisation is a skip with the reason)."""
    torch = require("torch")
    if not torch.cuda.is_available():
        raise BackendUnavailable("torch cannot use the GPU here (torch.cuda.is_available() is False: check the "
                                 "driver against torch's CUDA build and CUDA_VISIBLE_DEVICES)")
    return torch


def started(factory: Callable[..., Any], *args: Any, what: str) -> Any:
    """A TensorRT object from `factory`; pybind11 raises TypeError when TensorRT returns no object, which is how a
    CUDA initialisation failure (driver, GPU visibility, out of device memory) shows: a skip with the reason."""
    try:
        made = factory(*args)
    except TypeError as exc:
        raise BackendUnavailable(f"TensorRT could not create its {what} ({first_line(exc)}): CUDA did not start on "
                                 "this GPU (check the driver, CUDA_VISIBLE_DEVICES and free device memory)") from None
    if made is None:
        raise BackendUnavailable(f"TensorRT could not create its {what} (see the TensorRT log)")
    return made


__all__ = ["cuda_torch", "load_tensorrt", "started", "unavailable_reason"]
