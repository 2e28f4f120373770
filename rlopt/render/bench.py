"""Rendering of `rlopt bench`: the tables of a BenchReport, and progress lines on stderr."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape

from rlopt.render.fit import FittedTable
from rlopt.tools.bench.schema import BenchReport


def _us(value: float) -> str:
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} us"


def bench_tables(report: BenchReport) -> list[FittedTable]:
    """One table per network: shape x candidate, fastest first."""
    tables = []
    for net in report.networks:
        table = FittedTable(f"{net.network}: median / p99 per call, x = median / best ONNX Runtime median")
        for column in ("shape", "candidate"):
            table.add_column(column, justify="right")
        for column in ("median", "p99", "x ORT best", "GFLOP/s", "first call"):
            table.add_column(column, justify="right", wrap=False)
        for shape in net.shapes:
            label = f"{shape.point} " + " ".join("x".join(map(str, d)) for d in shape.shape.values())
            for i, r in enumerate(shape.results):
                ratio = "-" if r.ratio_to_ort_best is None else f"{r.ratio_to_ort_best:.2f}"
                style = "bold green" if i == 0 else ""
                table.add_row(label if i == 0 else "", f"[{style}]{r.candidate}[/]" if style else r.candidate,
                              _us(r.median_us), _us(r.p99_us), ratio,
                              "-" if r.gflops_per_s is None else f"{r.gflops_per_s:.1f}", f"{r.first_call_ms:.1f} ms")
            table.add_section()
        rounds = sorted({shape.rounds for shape in net.shapes})
        notes = [f"{skip.candidate}: {skip.reason}" for skip in net.skipped]
        table.caption = escape(f"{'/'.join(map(str, rounds)) or 0} interleaved rounds per shape, each candidate "
                               "in its own process; "
                               + ("not run: " + "; ".join(notes) if notes else "every candidate ran"))
        tables.append(table)
    if tables and report.warnings:
        tables[-1].caption += escape("; WARNING: " + "; ".join(report.warnings))
    return tables


@contextmanager
def bench_progress(console: Console) -> Iterator[Callable[[str], None]]:
    """A progress callback: a transient status line on a terminal, else one plain line per step."""
    if console.is_terminal:
        with console.status("bench: starting") as status:  # transient: a user error stays one line
            yield lambda text: status.update(escape(f"bench: {text}"))
    else:
        yield lambda text: console.print(f"bench: {text}", markup=False, highlight=False)


__all__ = ["bench_progress", "bench_tables"]
