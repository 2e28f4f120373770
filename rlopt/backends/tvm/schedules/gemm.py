"""The register-blocked GEMM micro-kernel every dense (and, after im2col, conv) kernel is scheduled with.

C[m, n] += A[m, k] * B[k, n] with n contiguous in B and C: a tile of `rows` x `vectors` fp32 vectors of C stays in
registers while k runs; per k the tile loads `vectors` vectors of B and broadcasts `rows` scalars of A, so it does
rows * vectors FMAs for rows + vectors loads. Tiles always divide the extents: a predicate on a tile row makes
LLVM keep the accumulators in memory (measured: 6-row tiles on 256 rows ran at half the speed of 4- or 8-row ones).
"""

from __future__ import annotations

from dataclasses import dataclass

from rlopt.backends.tvm.schedules.target import VectorUnit

MAX_VECTORS = 8  # vectors of one tile row: enough independent FMA chains for a one-row (GEMV) tile
MAX_ROWS = 16


@dataclass(frozen=True)
class Tile:
    """rows x (vectors x lanes) elements of C held in registers; `lanes` divides N (a ragged N vectorizes at a
    divisor of N, or whole when it is under two registers wide)."""

    rows: int
    vectors: int
    lanes: int

    @property
    def width(self) -> int:
        return self.vectors * self.lanes


def _divisors(n: int, limit: int) -> list[int]:
    return [d for d in range(1, min(n, limit) + 1) if n % d == 0]


def lanes_for(n: int, unit: VectorUnit) -> int:
    """Elements per vector along N: the register width where it divides N; N itself when N fits two registers
    (LLVM splits a 24-wide vector into a full and a masked one); else N's largest divisor under a register."""
    if n % unit.lanes == 0:
        return unit.lanes
    if n <= 2 * unit.lanes:
        return n
    return max(_divisors(n, unit.lanes))


def gemm_tile(m: int | None, n: int, unit: VectorUnit) -> Tile:
    """The tile with the most FMAs per load (rows * vectors / (rows + vectors)) that fits the accumulator budget
    and divides both extents; a symbolic M (the dynamic library) gets one-row tiles."""
    lanes = lanes_for(n, unit)
    per_vector = -(-lanes // unit.lanes)  # registers one vector of `lanes` elements takes
    budget = unit.accumulators
    best: tuple[float, int, Tile] | None = None
    for vectors in _divisors(n // lanes, MAX_VECTORS):
        for rows in _divisors(m, MAX_ROWS) if m is not None else [1]:
            registers = rows * vectors * per_vector
            if registers > budget:
                continue
            score = rows * vectors / (rows + vectors)
            candidate = (score, registers, Tile(rows, vectors, lanes))
            if best is None or candidate[:2] > best[:2]:
                best = candidate
    assert best is not None  # rows = vectors = 1 always fits
    return best[2]
