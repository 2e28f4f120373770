"""Rendering of `rlopt tune`'s result: one row per kernel, the workloads it serves, trials done, best latency."""

from __future__ import annotations

from rich.markup import escape

from rlopt.backends.tvm.tuning import TuneResult
from rlopt.render.fit import FittedTable
from rlopt.tools.tune.progress import best_text


def result_table(result: TuneResult) -> FittedTable:
    table = FittedTable(f"tuned into {escape(str(result.database))} ({result.cost_model} cost model, "
                        f"{result.seconds:.0f} s)")
    table.add_column("kernel")
    table.add_column("workloads", detail=True)
    table.add_column("trials", justify="right")
    table.add_column("best", justify="right")
    for task in result.tasks:
        table.add_row(escape(task.name), escape(", ".join(task.workloads)), str(task.done), best_text(task))
    for task in result.skipped:
        table.add_row(escape(task.name), escape(", ".join(task.workloads)), f"{task.records} (already tuned)", "-")
    return table


__all__ = ["result_table"]
