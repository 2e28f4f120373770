"""Whether TorchScript can run on CUDA here, torch with CUDA once it can, and the fp32 math that keeps it fp32.

Checked without importing torch (rlopt.machine reads torch's build from torch/version.py). Every caller goes
through this module's attributes, so the tests swap in a torch whose "CUDA" is the CPU in one place.
"""

from __future__ import annotations

from types import ModuleType

from rlopt.errors import BackendUnavailable
from rlopt.lazy import require
from rlopt.machine import cuda_torch_absent_reason

EXACT = "ieee"  # torch's fp32_precision for full fp32: cuDNN convolutions and RNNs default to tf32 in torch 2.13


def unavailable_reason() -> str | None:
    reason = cuda_torch_absent_reason()
    return None if reason is None else f"TorchScript on CUDA needs an NVIDIA GPU and a CUDA build of torch: {reason}"


def cuda_torch() -> ModuleType:
    """torch, with CUDA usable in this process (a failed CUDA initialisation is a skip with the reason)."""
    torch = require("torch")
    if not torch.cuda.is_available():
        raise BackendUnavailable("TorchScript on CUDA: torch cannot use the GPU here (torch.cuda.is_available() is "
                                 "False: check the driver against torch's CUDA build and CUDA_VISIBLE_DEVICES)")
    return torch


def device() -> str:
    return "cuda"


def exact_fp32(torch: ModuleType) -> None:
    """fp32 matrix products, convolutions and RNNs in full fp32, not TF32. torch's setting is process-wide: a
    process that opens an fp32 CUDA TorchScript artifact computes every fp32 CUDA op this way."""
    torch.backends.cuda.matmul.fp32_precision = EXACT
    torch.backends.cudnn.conv.fp32_precision = EXACT
    torch.backends.cudnn.rnn.fp32_precision = EXACT


__all__ = ["cuda_torch", "device", "exact_fp32", "unavailable_reason"]
