"""Reading a fused kernel's blocks: which is the reduction, what each operand is indexed by, what can be inlined."""

from __future__ import annotations

from typing import Any

from rlopt.lazy import require


class Refused(Exception):
    """A rule cannot schedule this kernel (the reason is recorded; the kernel keeps TVM's default loops)."""


def static_extent(value: Any) -> int | None:
    """An IntImm's value, or None for a symbolic extent."""
    return int(value.value) if hasattr(value, "value") else None


def root_blocks(sch: Any) -> list[Any]:
    return list(sch.get_child_blocks(sch.get_sblock("root")))


def is_reduction(sch: Any, block: Any) -> bool:
    tirx = require("tvm.tirx")
    return any(iv.iter_type == tirx.IterVar.CommReduce for iv in sch.get(block).iter_vars)


def only_reduction(sch: Any) -> tuple[Any, list[Any], list[Any]]:
    """(the single reduction block, the blocks before it, the blocks after it); Refused unless there is exactly one
    and every block is spatial or a plain reduction."""
    tirx = require("tvm.tirx")
    blocks = root_blocks(sch)
    kinds = [{iv.iter_type for iv in sch.get(b).iter_vars} for b in blocks]
    if any(kind - {tirx.IterVar.DataPar, tirx.IterVar.CommReduce} for kind in kinds):
        raise Refused("a block with opaque iterators")
    reductions = [i for i, kind in enumerate(kinds) if tirx.IterVar.CommReduce in kind]
    if len(reductions) != 1:
        raise Refused(f"{len(reductions)} reduction blocks")
    at = reductions[0]
    return blocks[at], blocks[:at], blocks[at + 1:]


def inline_producers(sch: Any, producers: list[Any]) -> list[Any]:
    """Inline element-wise producers into their consumers (a fused reshape or cast); the ones that stay."""
    kept = []
    for block in reversed(producers):
        try:
            sch.compute_inline(block)
        except Exception:  # TVM's ScheduleError: not inlinable (e.g. padding): the block stays a loop nest
            kept.append(block)
    return list(reversed(kept))


def single_epilogue(sch: Any, epilogue: list[Any]) -> Any | None:
    """Inline every element-wise epilogue block but the last into its consumers; the last one (None when the
    reduction writes the output itself). Refused when more than one block stays."""
    remaining = list(epilogue)
    changed = True
    while len(remaining) > 1 and changed:
        changed = False
        for block in remaining[:-1]:
            try:
                sch.compute_inline(block)
            except Exception:  # not inlinable (a reduction, several consumers that cannot recompute it)
                continue
            remaining.remove(block)
            changed = True
            break
    if len(remaining) > 1:
        raise Refused(f"{len(remaining)} epilogue blocks stay after inlining")
    return remaining[0] if remaining else None
