"""Whether TensorRT can build here, checked without importing it (the lean runtime segfaults without a GPU)."""

from __future__ import annotations

from importlib.util import find_spec

from rlopt.machine import gpu_absent_reason


def tensorrt_unavailable_reason() -> str | None:
    """Why TensorRT cannot build here, checked without importing it; None when it can."""
    reason = gpu_absent_reason()
    if reason is not None:
        return f"TensorRT needs an NVIDIA GPU: {reason}"
    if find_spec("tensorrt") is None:
        return ("TensorRT needs the 'tensorrt' package (NVIDIA's wheels, e.g. pip install tensorrt-cu12 from "
                "NVIDIA's index), not installed here")
    return None


__all__ = ["tensorrt_unavailable_reason"]
