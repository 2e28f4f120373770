"""Rule `rows`: row-wise reductions with element-wise work around them (layer norm, RMS norm, softmax, mean).

Every block shares the leading spatial loops (the rows) and reduces, if at all, over its trailing loops. Each
reduction is split into `lanes` partial sums kept in one vector (rfactor) and summed once at the end; then every
block moves under the row loop, so a row is read while it is in cache, and the element-wise blocks vectorize.
(TVM's dlight CPU Reduction rule moves blocks under the row loop first, after which rfactor is refused, so its
reductions stay scalar.)
"""

from __future__ import annotations

from typing import Any

from rlopt.backends.tvm.schedules.blocks import Refused, is_reduction, root_blocks, static_extent
from rlopt.backends.tvm.schedules.contraction import vectorize_inner
from rlopt.backends.tvm.schedules.target import VectorUnit
from rlopt.lazy import require

NAME = "rows"
PARALLEL_MIN_ELEMENTS = 1 << 15  # rows go to TVM's thread pool from ~10 us of work on one core


def _leading_spatial(sch: Any, block: Any) -> int:
    tirx = require("tvm.tirx")
    count = 0
    for iv in sch.get(block).iter_vars:
        if iv.iter_type != tirx.IterVar.DataPar:
            break
        count += 1
    return count


def _inline_spatial(sch: Any, blocks: list[Any]) -> list[Any]:
    """Inline every element-wise block but the last into its consumers; the blocks that stay, in order."""
    kept = []
    for block in blocks[:-1]:
        if is_reduction(sch, block):
            kept.append(block)
            continue
        try:
            sch.compute_inline(block)
        except Exception:  # several consumers it cannot be recomputed in, or a layout change: it stays a block
            kept.append(block)
    return kept + blocks[-1:]


def _vector_reduction(sch: Any, block: Any, lanes: int) -> Any | None:
    """Split the block's innermost (reduction) loop into `lanes` partial sums (one vector): the partial-sum block,
    or None for a short or ragged reduction (LLVM unrolls it as it is)."""
    inner = sch.get_loops(block)[-1]
    extent = static_extent(sch.get(inner).extent)
    if extent is None or extent < 2 * lanes or extent % lanes:
        return None
    _, lane = sch.split(inner, [None, lanes])
    return sch.rfactor(lane, factor_axis=_leading_spatial(sch, block))


def schedule(func: Any, unit: VectorUnit) -> Any:
    s_tir = require("tvm.s_tir")
    sch = s_tir.Schedule(func)
    blocks = root_blocks(sch)
    if len(blocks) < 2 or not any(is_reduction(sch, b) for b in blocks):
        raise Refused("no row reduction")
    if is_reduction(sch, blocks[-1]):
        raise Refused("the output block is a reduction")
    blocks = _inline_spatial(sch, blocks)
    rows = min(_leading_spatial(sch, b) for b in blocks)
    if rows == 0:
        raise Refused("a block with no leading row loop")
    partials = []
    for block in blocks:
        if is_reduction(sch, block):
            partial = _vector_reduction(sch, block, unit.lanes)
            if partial is not None:
                partials.append(partial)
    last = blocks[-1]
    row_loops = sch.get_loops(last)[:rows]
    row = sch.fuse(*row_loops) if rows > 1 else row_loops[0]
    elements = 1
    for loop in sch.get_loops(last):
        extent = static_extent(sch.get(loop).extent)
        elements = elements * extent if extent is not None and elements is not None else None
    row_count = static_extent(sch.get(row).extent)
    for block in reversed(root_blocks(sch)[:-1]):
        sch.compute_at(block, row, preserve_unit_loops=True)
    if elements is not None and elements >= PARALLEL_MIN_ELEMENTS and row_count is not None and row_count >= 2:
        sch.parallel(row)  # before the reductions are decomposed: TVM checks the loop's dataflow here
    for partial in partials:
        # under the row loop: [row, lane, (unit loops), k outer]; the lanes go innermost, one vector per k step
        loops = sch.get_loops(partial)
        lane, k_outer = loops[1], loops[-1]
        sch.reorder(k_outer, lane)
        sch.vectorize(lane)
        sch.decompose_reduction(partial, k_outer)
    for block in blocks:
        if not is_reduction(sch, block):
            vectorize_inner(sch, block, unit.lanes, outer=1)

    return sch
