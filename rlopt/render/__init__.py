"""Rich rendering for the CLI: progress on stderr, result tables on stdout.

`rlopt.render.bench` and `rlopt.render.warmup` render those tools' reports; the tools themselves never
import rich. Piped output (a console that is not a terminal, and no COLUMNS in the environment) is
laid out on a wide console: rich would otherwise wrap every table at 80 columns.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn
from rich.table import Table

from rlopt.manifest import Manifest, Parity

if TYPE_CHECKING:
    from rlopt.verify import VerifyReport
    from typing_extensions import Self

    from rlopt.logs import NativeLog

PIPED_WIDTH = 1000  # columns of a console that is not a terminal: tables take their natural width


def console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr); wide when it is not a terminal and COLUMNS does not say otherwise."""
    made = Console(stderr=stderr)
    if not made.is_terminal and not os.environ.get("COLUMNS", "").isdigit():
        made = Console(stderr=stderr, width=PIPED_WIDTH)
    return made


stderr = console(stderr=True)
stdout = console()


class ProgressReporter:
    """Live per-stage progress on stderr; also keeps the rows for the summary table."""

    def __init__(self, console: Console = stderr) -> None:
        self.rows: list[tuple[str, str, str, float, str]] = []
        self._progress = Progress(SpinnerColumn(), TextColumn("{task.description}"), TimeElapsedColumn(),
                                  console=console, transient=True)
        self._tasks: dict[tuple[str, str], Any] = {}

    def __enter__(self) -> Self:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def stage_started(self, network: str, stage: str) -> None:
        self._tasks[(network, stage)] = self._progress.add_task(f"[bold]{network}[/] {stage} ...", total=1)

    def stage_finished(self, network: str, stage: str, status: str, seconds: float, detail: str) -> None:
        style = {"ok": "green", "skipped": "yellow"}.get(status, "red")
        task = self._tasks.get((network, stage))
        if task is not None:
            self._progress.update(task, completed=1,
                                  description=f"[bold]{network}[/] {stage} [{style}]{status}[/] {escape(detail)}")
        self.rows.append((network, stage, status, seconds, detail))


def _fmt_us(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} us"


def parity_text(parity: Parity | None) -> str:
    if parity is None:
        return "-"
    text = ("ok" if parity.passed else "FAIL") + f" abs {parity.max_abs:.1e}"
    if parity.kl is not None:
        text += f" kl {parity.kl:.1e}"
    if parity.argmax_agree is not None:
        text += f" argmax {parity.argmax_agree:.0%}"
    return text


def summary_table(manifest: Manifest, title: str = "") -> Table:
    """One row per network and backend: artifact, parity, latency at every profile point."""
    points = ["min", "opt", "max"]
    table = Table(title=title or f"{manifest.name}: artifacts, parity and latency (p50 / p99)")
    for column in ("network", "backend", "artifact", "parity", *points):
        table.add_column(column, overflow="fold")
    for name, network in manifest.networks.items():
        for backend, record in network.artifacts.items():
            label = backend + (" *" if backend == network.selected else "")
            if record.skipped:
                table.add_row(name, label, "[yellow]skipped[/]", escape(record.skipped), "", "", "")
                continue
            cells = [f"{_fmt_us(lat.p50)} / {_fmt_us(lat.p99)}" if (lat := record.latency_us.get(p)) else "-"
                     for p in points]
            parity = (f"[yellow]not verified[/]: {record.facts.not_verified}"
                      if record.facts.verified is False else parity_text(record.parity))
            table.add_row(name, label, record.path or "-", parity, *cells)
    table.caption = ("* = selected (what `auto` runs at the opt shape; it may mix backends, see rlopt inspect); "
                     "latency is a short measurement, see rlopt bench")
    return table


def stage_table(rows: list[tuple[str, str, str, float, str]]) -> Table:
    table = Table(title="stages")
    for column in ("network", "stage", "status", "time", "detail"):
        table.add_column(column, overflow="fold")
    for network, stage, status, seconds, detail in rows:
        table.add_row(network, stage, status, f"{seconds:.2f} s", escape(detail))
    return table


def parity_failure_table(manifest: Manifest) -> Table:
    """Backend, output, max abs/rel error, and the tolerance that would have passed."""
    table = Table(title="[red]verification failed[/]")
    for column in ("network", "backend", "output", "max abs", "max rel", "atol that would pass", "kl", "reason"):
        table.add_column(column, overflow="fold")
    for name, network in manifest.networks.items():
        for backend, record in network.artifacts.items():
            if record.skipped and record.skipped.startswith("build failed"):
                table.add_row(name, backend, "-", "-", "-", "-", "-", escape(record.skipped))
            if record.parity is None or record.parity.passed:
                continue
            for out in record.parity.outputs:
                if out.passed:
                    continue
                table.add_row(name, backend, out.name, f"{out.max_abs:.3e}", f"{out.max_rel:.3e}",
                              f"{out.needed_atol:.3e} (rtol {network.tolerance['rtol']:g})",
                              "-" if out.kl is None else f"{out.kl:.3e} (max_kl {network.tolerance['max_kl']:g})",
                              escape(out.reason or "outside atol/rtol"))
            if record.parity.compared == 0:
                table.add_row(name, backend, "-", "-", "-", "-", "-", "nothing was compared")
    return table


def verify_table(report: VerifyReport) -> Table:
    """One row per finding of `rlopt verify`: the file or backend, ok or FAIL, and the parity it measured."""
    table = Table(title=f"verify {report.model_dir}")
    for column in ("network", "file / backend", "result", "detail"):
        table.add_column(column, overflow="fold")
    for f in report.findings:
        detail = f.detail + (f" ({parity_text(f.parity)})" if f.parity else "")
        result = "[yellow]unverified[/]" if f.unverified else "[green]ok[/]" if f.ok else "[red]FAIL[/]"
        table.add_row(f.network, f.subject, result, escape(detail))
    return table


def native_log_note(log: NativeLog, console: Console | None = None) -> None:
    """One dim line on stderr saying where native libraries' own messages went, when they wrote any."""
    if log.has_output():
        (console or stderr).print(f"native library messages: {log.path}", markup=False, highlight=False,
                                  style="dim")


def elapsed(start: float) -> str:
    return f"{time.perf_counter() - start:.1f} s"
