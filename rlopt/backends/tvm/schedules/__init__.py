"""Schedule rules: fast loops for every kernel a tuning database has no record for, with no tuning run.

Without a record, TVM runs a kernel as its plain loop nest (serial, scalar): 10-100x slower than ONNX Runtime beyond
batch 1. Each rule here recognises one kind of fused kernel and writes a schedule for any shape of it; the first
rule that accepts a kernel schedules it. A kernel no rule accepts keeps the default loops (and its reason is kept).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from rlopt.backends.tvm.schedules import conv, dense, elementwise, rows
from rlopt.backends.tvm.schedules.blocks import Refused
from rlopt.backends.tvm.schedules.target import VectorUnit, vector_unit
from rlopt.lazy import require

# the modules whose source decides the schedules: part of the TVM build stage's cache key
MODULES = tuple(f"rlopt.backends.tvm.schedules{part}" for part in (
    "", ".blocks", ".contraction", ".conv", ".dense", ".elementwise", ".gemm", ".rows", ".target"))
Rule = tuple[str, Callable[[Any, VectorUnit], Any]]
RULES: list[Rule] = [(dense.NAME, dense.schedule), (conv.NAME, conv.schedule), (rows.NAME, rows.schedule),
                     (elementwise.NAME, elementwise.schedule)]


@dataclass
class RuleReport:
    """Which rule scheduled each kernel, and why the others were left alone."""

    scheduled: dict[str, str] = field(default_factory=dict)
    refused: dict[str, str] = field(default_factory=dict)
    parallel: list[str] = field(default_factory=list)  # scheduled kernels with a loop split among TVM's threads


def is_scheduled(func: Any) -> bool:
    attrs = func.attrs
    return attrs is not None and bool(attrs.get("tirx.is_scheduled", False))


def has_parallel_loop(sch: Any) -> bool:
    """Whether the schedule split a loop among TVM's threads."""
    return any(inst.kind.name == "Parallel" for inst in sch.trace.insts)


def apply_rules(mod: Any, target: Any, rules: list[Rule] | None = None) -> tuple[Any, RuleReport]:
    """`mod` with every unscheduled PrimFunc a rule accepts replaced by its scheduled form (marked scheduled, as a
    tuning record would be), and the report."""
    tirx = require("tvm.tirx")
    unit = vector_unit(target)
    report = RuleReport()
    updates = {}
    for gv, func in mod.functions_items():
        if not isinstance(func, tirx.PrimFunc) or is_scheduled(func):
            continue
        reasons = []
        for name, rule in rules if rules is not None else RULES:
            try:
                sch = rule(func, unit)
            except Refused as refusal:
                reasons.append(f"{name}: {refusal}")
                continue
            except Exception as exc:  # a TVM ScheduleError on a form the rule did not foresee: keep the default
                reasons.append(f"{name}: {type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]}")
                continue
            updates[gv] = sch.mod["main"].with_attr("tirx.is_scheduled", True)
            report.scheduled[gv.name_hint] = name
            if has_parallel_loop(sch):
                report.parallel.append(gv.name_hint)
            break
        else:
            report.refused[gv.name_hint] = "; ".join(reasons)
    for gv, func in updates.items():
        mod[gv] = func
    return mod, report


__all__ = ["MODULES", "RULES", "RuleReport", "apply_rules", "is_scheduled", "vector_unit"]
