"""Rendering of `rlopt diff`: the tables of a DiffReport, and progress lines on stderr."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from rich.console import Console
from rich.markup import escape

from rlopt.render.fit import FittedTable
from rlopt.tools.diff.report import checks, drift_text, ratio_text, shape_name
from rlopt.tools.diff.schema import DiffReport


def _us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} us"


def latency_table(report: DiffReport) -> FittedTable:
    """Per network and named shape: each selected route timed now, the ratio, the A/A noise, the verdict."""
    limit = report.thresholds.max_latency_ratio
    table = FittedTable(f"latency of the selected route, timed now: new / old (regression above {limit:g} "
                        "and the A/A noise)")
    for column in ("network", "shape", "route (old -> new)"):
        table.add_column(column)
    for column in ("old", "new"):
        table.add_column(column, justify="right", wrap=False)
    for column in ("new / old", "A/A noise"):
        table.add_column(column, justify="right")
    table.add_column("verdict", detail=True)
    for network in report.networks:
        for row in network.latency:
            route = row.new_route if row.old_route == row.new_route else f"{row.old_route} -> {row.new_route}"
            verdict = "[red]slower[/]" if row.regression else ("[green]ok[/]" if row.ratio is not None
                                                               else escape(row.note))
            table.add_row(network.network, shape_name(row), escape(str(route)), _us(row.old_us), _us(row.new_us),
                          ratio_text(row),
                          "-" if row.aa_noise is None else f"{row.aa_noise:.2f}", verdict)
    table.caption = escape(f"{report.budget_s:g} s of interleaved rounds per shape, seed {report.seed}")
    return table


def checks_table(report: DiffReport) -> FittedTable:
    """Per network: drift, routes, backends and files (what changed), each check's verdict."""
    limit = report.thresholds.max_drift_kl
    table = FittedTable("drift and changes, NEW_DIR against OLD_DIR")
    for column in ("network", "check", "result"):
        table.add_column(column)
    table.add_column("detail", detail=True)
    for network in report.networks:
        for check in checks(network, report.thresholds.max_latency_ratio):
            if check.name.startswith("latency "):
                continue
            if check.name == "drift":
                detail = drift_text(network) + ("" if limit is not None and network.kind == "policy"
                                                else " (reported, not a failure)")
            elif check.name == "parity":
                detail = "; ".join(f"{c.name} {c.new}" for c in network.backends if c.new) + " (at compile time)"
            elif check.name == "routes":
                detail = "; ".join(f"{c.name} {c.old} -> {c.new}" for c in network.routes if c.changed) or "unchanged"
            elif check.name == "backends":
                detail = "; ".join(f"{c.name} {c.old or 'absent'} -> {c.new or 'absent'}"
                                   for c in network.backends if c.changed) or "unchanged"
            elif check.name == "files":
                moved = {k: len(getattr(network.files, k)) for k in ("added", "dropped", "changed")}
                detail = ", ".join(f"{n} {k}" for k, n in moved.items() if n) or "unchanged"
                detail += f"; {network.files.same} unchanged"
            else:
                detail = "; ".join(check.details)
            result = "[red]FAIL[/]" if check.failures else "[green]ok[/]"
            table.add_row(network.network, check.name, result, escape(detail))
    return table


def diff_tables(report: DiffReport) -> list[FittedTable]:
    return [latency_table(report), checks_table(report)]


@contextmanager
def diff_progress(console: Console) -> Iterator[Callable[[str], None]]:
    """A progress callback: a transient status line on a terminal, else one plain line per step."""
    if console.is_terminal:
        with console.status("diff: starting") as status:  # transient: a user error stays one line
            yield lambda text: status.update(escape(f"diff: {text}"))
    else:
        yield lambda text: console.print(f"diff: {text}", markup=False, highlight=False)


__all__ = ["checks_table", "diff_progress", "diff_tables", "latency_table"]
