"""Rendering of `rlopt warmup`: a live table on a terminal (plain progress lines otherwise), the report table."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.live import Live
from rich.markup import escape
from rich.table import Table

from rlopt.render.fit import FittedTable
from rlopt.tools.warmup.driver import LIVE_WINDOW_S
from rlopt.tools.warmup.schema import LatencySummary, LiveStatus, WarmupReport

if TYPE_CHECKING:
    from typing_extensions import Self


def _ms(value: float | None) -> str:
    return "-" if value is None else (f"{value:.3f}" if value < 1 else f"{value:.2f}")


class LiveDisplay:
    """A rich Live panel on stderr: elapsed / remaining, requests, current p50 / p99 per shape."""

    def __init__(self, console: Console | None = None) -> None:
        self._live = Live(console=console or Console(stderr=True), auto_refresh=False, redirect_stdout=False,
                          redirect_stderr=False, transient=False)

    def __enter__(self) -> Self:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(*exc)

    def __call__(self, status: LiveStatus) -> None:
        remaining = max(0.0, status.duration_s - status.elapsed_s)
        table = Table(title=f"warmup {status.network} on {status.backend} ({status.phase}): "
                            f"{status.elapsed_s:.1f} s elapsed, {remaining:.1f} s left, {status.requests} requests, "
                            f"{status.concurrency} thread(s), probes {status.probes} "
                            + ("[green]consistent[/]" if not status.divergences
                               else f"[red]{status.divergences} diverged[/]"),
                      title_justify="left")
        for column in ("shape", "requests", "first call ms", f"p50 ms (last {LIVE_WINDOW_S:g} s)",
                       f"p99 ms (last {LIVE_WINDOW_S:g} s)"):
            table.add_column(column, justify="right")
        for row in status.shapes:
            table.add_row(row.label, str(row.count), _ms(row.first_call_ms), _ms(row.p50_ms), _ms(row.p99_ms))
        self._live.update(table, refresh=True)


def report_table(report: WarmupReport) -> FittedTable:
    """The human summary: one row per shape, cold (before steady state) vs steady; p95 is in the JSON."""
    steady = "steady state not reached" if report.time_to_steady_s is None else \
        f"steady state at {report.time_to_steady_s:.2f} s"
    table = FittedTable(f"warmup {report.network} on {report.backend}: {report.requests} requests in "
                        f"{report.elapsed_s:.1f} s from {report.concurrency} thread(s), load {report.load_ms:.0f} ms, "
                        f"{steady}" + (" [yellow](interrupted)[/]" if report.interrupted else ""))
    for column in ("shape", "share", "requests", "req/s", "first call ms", "cold p50 / p99 ms", "steady at s"):
        table.add_column(column, justify="right", wrap=column in ("shape", "cold p50 / p99 ms"))
    table.add_column("steady p50 / p99 ms", justify="right", detail=True)

    def pair(summary: LatencySummary | None) -> str:
        return "-" if summary is None else f"{_ms(summary.p50_ms)} / {_ms(summary.p99_ms)}"

    for shape in report.shapes:
        table.add_row(shape.label, f"{shape.share:.0%}", str(shape.count), f"{shape.throughput_rps:.0f}",
                      _ms(shape.first_call_ms), pair(shape.before_steady),
                      "-" if shape.time_to_steady_s is None else f"{shape.time_to_steady_s:.2f}",
                      pair(shape.after_steady) if shape.after_steady else f"[yellow]{escape(shape.note or '-')}[/]")
    consistency = report.consistency
    table.caption = ("consistency: " + ("[green]ok[/] " if consistency.passed else "[red]FAILED[/] ")
                     + escape(consistency.detail)
                     + ("" if report.slo is None else
                        f"; SLO p99 {report.slo.p99_ms:g} ms: measured {_ms(report.slo.measured_p99_ms)} ms "
                        f"({report.slo.basis}) " + ("[green]met[/]" if report.slo.passed else "[red]missed[/]"))
                     + "".join(f"; [yellow]WARNING[/] {escape(w)}" for w in report.warnings))
    return table


class PlainProgress:
    """For a console that is not a terminal: one newline-terminated line per phase, no live redrawing."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._phase = ""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        pass

    def __call__(self, status: LiveStatus) -> None:
        if status.phase == self._phase:
            return
        self._phase = status.phase
        if status.phase == "under load":
            text = (f"warmup {status.network} on {status.backend}: under load from {status.concurrency} thread(s) "
                    f"for {status.duration_s:g} s")
        elif status.phase == "done":
            text = (f"warmup {status.network} on {status.backend}: done, {status.requests} requests in "
                    f"{status.elapsed_s:.1f} s, {status.probes} probes, {status.divergences} diverged")
        else:
            text = f"warmup {status.network} on {status.backend}: {status.phase}"
        self._console.print(text, markup=False, highlight=False)


def monitor_for(console: Console) -> LiveDisplay | PlainProgress:
    """The live table on a terminal; plain lines when the console is piped (a live table would be glued to them)."""
    return LiveDisplay(console) if console.is_terminal else PlainProgress(console)


__all__ = ["LiveDisplay", "PlainProgress", "monitor_for", "report_table"]
