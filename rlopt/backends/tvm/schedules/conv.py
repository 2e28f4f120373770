"""Rule `conv`: a fused convolution (+ bias, + activation) as a GEMM read straight from its input: rows are output
positions (batch and spatial, fused), columns the output channels, the reduction the input channels times the
window; the weight is packed into column panels (contraction.py). No im2col buffer is made: each tile row
broadcasts its input element per reduction step."""

from __future__ import annotations

from typing import Any

from rlopt.backends.tvm.schedules import contraction
from rlopt.backends.tvm.schedules.target import VectorUnit

NAME = "conv"


def schedule(func: Any, unit: VectorUnit) -> Any:
    return contraction.schedule(func, unit, conv=True)
