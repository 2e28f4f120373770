"""Rich display for `rlopt tune`: one row per kernel (task), trials done, best latency (the result table after it is
rlopt.render.tune's)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from rlopt.backends.tvm.tuning import Task


def best_text(task: Task) -> str:
    return "-" if task.best_us is None else f"{task.best_us:.1f} us"


class TuneProgress:
    """A TuneReporter that draws live progress on stderr (MetaSchedule's own logs are silenced)."""

    def __init__(self, console: Console) -> None:
        self._console = console
        self._progress = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                                  TextColumn("best {task.fields[best]}"), TimeElapsedColumn(), console=console)
        self._rows: dict[int, Any] = {}

    def __enter__(self) -> TuneProgress:
        self._progress.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._progress.__exit__(*exc)

    def tuning_started(self, tasks: list[Task], skipped: list[Task]) -> None:
        for task in skipped:
            self._console.print(f"[dim]already tuned: {task.name} ({task.records} records)[/]")
        if tasks:
            self._console.print(f"tuning {len(tasks)} kernel(s); worker set-up takes 10-40 s before the first trial")
        for task in tasks:
            self._rows[id(task)] = self._progress.add_task(task.name, total=task.trials, best="-")

    def trials_measured(self, task: Task) -> None:
        row = self._rows.get(id(task))
        if row is not None:
            self._progress.update(row, completed=min(task.done, task.trials), best=best_text(task))

    def tuning_finished(self, stopped_by_budget: bool) -> None:
        if stopped_by_budget:
            self._console.print("[yellow]time budget spent: tuning stopped; the next run resumes it[/]")
