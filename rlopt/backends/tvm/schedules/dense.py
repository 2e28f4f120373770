"""Rule `dense`: a fused matmul (+ bias, + activation): C[.., m, n] = A[.., m, k] @ B[.., k, n] with its element-wise
epilogue, as a register-blocked micro-kernel (contraction.py, gemm.py); a weight B is packed into column panels."""

from __future__ import annotations

from typing import Any

from rlopt.backends.tvm.schedules import contraction
from rlopt.backends.tvm.schedules.target import VectorUnit

NAME = "dense"


def schedule(func: Any, unit: VectorUnit) -> Any:
    return contraction.schedule(func, unit, conv=False)
