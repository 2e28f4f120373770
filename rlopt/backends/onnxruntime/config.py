"""The recipe's `onnxruntime` section."""

from __future__ import annotations

from pydantic import Field

from rlopt.onnx_session import CPU_PROVIDER
from rlopt.spec import Strict


class OnnxRuntimeConfig(Strict):
    providers: list[str] = Field(default_factory=lambda: [CPU_PROVIDER])
    # the CUDA provider's use_tf32 (on by default in ONNX Runtime): false keeps fp32 exact, true allows TF32
    tf32: bool = False


__all__ = ["OnnxRuntimeConfig"]
