"""What a CPU schedule needs to know about the target: fp32 lanes per vector register and how many registers."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlopt.lazy import require


@dataclass(frozen=True)
class VectorUnit:
    """fp32 lanes of one vector register and the register count (the accumulator budget of a micro-kernel)."""

    lanes: int
    registers: int
    name: str

    @property
    def accumulators(self) -> int:
        """Registers a GEMM tile may keep as accumulators: the rest hold a broadcast and the operand loads."""
        return max(4, self.registers - 4)


def vector_unit(target: Any) -> VectorUnit:
    """AVX-512: 16 lanes, 32 registers; AVX/AVX2: 8 lanes, 16 registers; NEON/SSE: 4 lanes (from LLVM's features
    for the target's mcpu, the same code generation the kernels get)."""
    codegen = require("tvm.target.codegen")
    try:
        features = {str(f) for f in codegen.llvm_get_cpu_features(target)}
    except Exception:  # a target LLVM cannot describe: the narrowest common vector
        features = set()
    if "avx512f" in features:
        return VectorUnit(16, 32, "avx512")
    if "avx" in features:
        return VectorUnit(8, 16, "avx2" if "avx2" in features else "avx")
    if "neon" in features or "sve" in features:
        return VectorUnit(4, 32, "neon")
    return VectorUnit(4, 16, "sse")
