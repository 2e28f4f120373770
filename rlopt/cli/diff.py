"""`rlopt diff OLD_DIR NEW_DIR`: the CI gate (contract section 15); `rlopt compile --baseline` ends with it too."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Optional

import typer

from rlopt.cli.base import JsonFlag, JunitOption, app, exit_failed, print_json

if TYPE_CHECKING:
    from rlopt.tools.diff import DiffReport

def show_diff(report: DiffReport, junit: Path | None, json_document: dict[str, Any] | None = None) -> None:
    """Write the CI reports (--junit, $GITHUB_STEP_SUMMARY), then print `json_document` (--json) or the tables, then
    exit 1 with one FAIL line per regression."""
    from rlopt.render import stdout
    from rlopt.render.diff import diff_tables
    from rlopt.tools.diff import write_reports

    write_reports(report, junit)
    if json_document is not None:
        print_json(json_document)
    else:
        for table in diff_tables(report):
            stdout.print(table)
        if report.passed:
            stdout.print(f"no regression: {report.new_dir} against {report.old_dir}", markup=False, highlight=False)
    if not report.passed:
        exit_failed(report.regressions, f"{len(report.regressions)} regression(s): {report.new_dir} against "
                                        f"{report.old_dir}")


@app.command("diff")
def diff_command(
    old_dir: Annotated[Path, typer.Argument(help="The MODEL_DIR in production (the last release).")],
    new_dir: Annotated[Path, typer.Argument(help="The candidate MODEL_DIR; its recipe's ci: section sets the "
                                            "thresholds.")],
    network: Annotated[Optional[list[str]], typer.Option("--network", help="Only this network (repeatable).")] = None,
    max_latency_ratio: Annotated[Optional[float], typer.Option("--max-latency-ratio", help="New / old latency of "
                                                               "the selected route above which a shape regresses "
                                                               "(default: ci.max_latency_ratio, 1.10).")] = None,
    max_drift_kl: Annotated[Optional[float], typer.Option("--max-drift-kl", help="Mean KL(old || new) of a policy "
                                                          "above which it regresses (default: ci.max_drift_kl: "
                                                          "reported only).")] = None,
    allow_dropped_backends: Annotated[Optional[bool], typer.Option(
        "--allow-dropped-backends/--no-allow-dropped-backends",
        help="Whether a backend built in OLD_DIR and not in NEW_DIR is allowed (default: "
             "ci.allow_dropped_backends, false).")] = None,
    junit: JunitOption = None,
    budget: Annotated[float, typer.Option("--budget", help="Seconds of interleaved timed rounds per shape.")] = 2.0,
    json_out: JsonFlag = False,
) -> None:
    """Gate a release on NEW_DIR against OLD_DIR: latency, routes, backends, files, drift; exit 1 per regression."""
    import contextlib

    from rlopt.logs import native_output_to_log, stdout_kept_for_json
    from rlopt.render import native_log_note, stderr
    from rlopt.render.diff import diff_progress
    from rlopt.tools.diff import run_diff
    from rlopt.tools.diff.report import check_writable

    check_writable(junit)
    with native_output_to_log("diff") as log, diff_progress(stderr) as progress, \
            (stdout_kept_for_json() if json_out else contextlib.nullcontext()):
        report = run_diff(old_dir, new_dir, network, max_latency_ratio=max_latency_ratio, max_drift_kl=max_drift_kl,
                          allow_dropped_backends=allow_dropped_backends, budget_s=budget, progress=progress)
    native_log_note(log)
    show_diff(report, junit, report.model_dump(mode="json") if json_out else None)
