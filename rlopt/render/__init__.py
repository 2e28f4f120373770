"""Rich rendering for the CLI: progress on stderr, result tables on stdout.

`rlopt.render.bench` and `rlopt.render.warmup` render those tools' reports; the tools themselves never
import rich. Every table is a `FittedTable` (rlopt.render.fit): it fits the console, a terminal's width or, piped
(no terminal, no COLUMNS in the environment), PIPED_WIDTH columns, with long details as numbered notes under it.
"""

from __future__ import annotations

import os
import time
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.markup import escape
from rich.progress import Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from rlopt.manifest import Manifest, Parity
from rlopt.render.fit import FittedTable

if TYPE_CHECKING:
    from rlopt.verify import VerifyReport
    from typing_extensions import Self

    from rlopt.logs import NativeLog

PIPED_WIDTH = 100  # columns of a console that is not a terminal (a CI log, `| tee`): the same layout every time


def console(stderr: bool = False) -> Console:
    """A console on stdout (or stderr); PIPED_WIDTH wide when it is not a terminal and COLUMNS does not say
    otherwise."""
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


def parity_text(parity: Parity | None, lines: bool = False) -> str:
    """'ok abs 4.5e-08 kl 2.4e-16 argmax 100%'; with `lines`, the verdict and error on one line, a policy's KL and
    argmax agreement on the next."""
    if parity is None:
        return "-"
    text = ("ok" if parity.passed else "FAIL") + f" abs {parity.max_abs:.1e}"
    policy = ([f"kl {parity.kl:.1e}"] if parity.kl is not None else []) + \
        ([f"argmax {parity.argmax_agree:.0%}"] if parity.argmax_agree is not None else [])
    return text + ("\n" if lines else " ") + " ".join(policy) if policy else text


def summary_table(manifest: Manifest, title: str = "") -> FittedTable:
    """One row per network and backend: artifact, parity, latency (p50 over p99) at every profile point."""
    points = ["min", "opt", "max"]
    table = FittedTable(title or f"{manifest.name}: artifacts, parity and latency (p50 over p99)",
                        "* = selected (what `auto` runs at the opt shape; it may mix backends, see rlopt inspect); "
                        "latency is a short measurement, see rlopt bench")
    table.add_column("network")
    table.add_column("backend / file")
    table.add_column("parity", detail=True, lines=4)
    for point in points:
        table.add_column(point, justify="right", wrap=False)
    for name, network in manifest.networks.items():
        for backend, record in network.artifacts.items():
            label = backend + (" *" if backend == network.selected else "")
            if record.skipped:
                table.add_row(name, f"{label}\n[yellow]skipped[/]", escape(record.skipped), "", "", "")
                continue
            cells = [f"{_fmt_us(lat.p50)}\n[dim]{_fmt_us(lat.p99)}[/]" if (lat := record.latency_us.get(p)) else "-"
                     for p in points]
            parity = (f"[yellow]not verified[/]: {escape(str(record.facts.not_verified))}"
                      if record.facts.verified is False else parity_text(record.parity, lines=True))
            file = escape(record.path.rpartition("/")[2]) if record.path else "-"
            table.add_row(name, f"{label}\n[dim]{file}[/]", parity, *cells)
    return table


def stage_table(rows: list[tuple[str, str, str, float, str]]) -> FittedTable:
    table = FittedTable("stages")
    for column in ("network", "stage", "status"):
        table.add_column(column)
    table.add_column("time", justify="right")
    table.add_column("detail", detail=True)
    for network, stage, status, seconds, detail in rows:
        table.add_row(network, stage, status, f"{seconds:.2f} s", escape(detail))
    return table


def parity_failure_table(manifest: Manifest) -> FittedTable:
    """Per failing output: its error, the atol that would have passed (at the recipe's rtol), KL, and why."""
    table = FittedTable("[red]verification failed[/]")
    for column in ("network / backend", "output"):
        table.add_column(column)
    for column in ("max error", "atol to pass", "kl"):
        table.add_column(column, justify="right")
    table.add_column("why", detail=True)
    for name, network in manifest.networks.items():
        rtol, max_kl = network.tolerance["rtol"], network.tolerance["max_kl"]
        for backend, record in network.artifacts.items():
            subject = f"{name}/{backend}"
            if record.skipped and record.skipped.startswith("build failed"):
                table.add_row(subject, "-", "-", "-", "-", escape(record.skipped))
            if record.parity is None or record.parity.passed:
                continue
            for out in record.parity.outputs:
                if out.passed:
                    continue
                table.add_row(subject, escape(out.name), f"abs {out.max_abs:.2e}\nrel {out.max_rel:.2e}",
                              f"{out.needed_atol:.2e}\n(rtol {rtol:g})",
                              "-" if out.kl is None else f"{out.kl:.2e}\n(max {max_kl:g})",
                              escape(out.reason or "outside atol/rtol"))
            if record.parity.compared == 0:
                table.add_row(subject, "-", "-", "-", "-", "nothing was compared")
    return table


def verify_table(report: VerifyReport) -> FittedTable:
    """One row per finding of `rlopt verify`: the file or backend, ok or FAIL, and the parity it measured."""
    table = FittedTable(f"verify {escape(str(report.model_dir))}")
    for column in ("network", "file / backend", "result"):
        table.add_column(column)
    table.add_column("detail", detail=True)
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
