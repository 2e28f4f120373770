"""Rule `elementwise`: a kernel with no reduction (casts, scaling, activations, reshapes) as one vectorized loop.

Every block but the last is inlined into its consumer, so the data is read once. TVM's default keeps one scalar loop nest per block (the Atari input's uint8 cast
and /255 at [8, 4, 84, 84]: 108 us, two passes over the frames).
"""

from __future__ import annotations

from typing import Any

from rlopt.backends.tvm.schedules.blocks import Refused, is_reduction, root_blocks
from rlopt.backends.tvm.schedules.contraction import vectorize_inner
from rlopt.backends.tvm.schedules.target import VectorUnit
from rlopt.lazy import require

NAME = "elementwise"


def schedule(func: Any, unit: VectorUnit) -> Any:
    s_tir = require("tvm.s_tir")
    sch = s_tir.Schedule(func)
    blocks = root_blocks(sch)
    if not blocks or any(is_reduction(sch, b) for b in blocks):
        raise Refused("a reduction")
    for block in blocks[:-1]:
        try:
            sch.compute_inline(block)
        except Exception:  # TVM's ScheduleError: a block with several consumers or a layout it cannot inline
            raise Refused("a block that cannot be inlined") from None
    # only the innermost loop is vectorized: a fused loop's vector index needs div/mod per dimension (measured 4.5x
    # slower on [8, 4, 84, 84]); a plain inner loop that the width does not divide is left to LLVM's vectorizer
    vectorize_inner(sch, blocks[-1], unit.lanes)
    return sch
