"""The recipe's `onnxruntime` section."""

from __future__ import annotations

from pydantic import Field

from rlopt.onnx_session import CPU_PROVIDER
from rlopt.spec import Strict


class OnnxRuntimeConfig(Strict):
    providers: list[str] = Field(default_factory=lambda: [CPU_PROVIDER])


__all__ = ["OnnxRuntimeConfig"]
