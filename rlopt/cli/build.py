"""`rlopt compile` and `rlopt refit`: the commands that write a MODEL_DIR."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rlopt.cli.base import JsonFlag, JunitOption, app, exit_failed, print_json


@app.command("compile")
def compile_command(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML (contract section 1), or an SB3 agent .zip.")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="MODEL_DIR (default artifacts/<name>).")] = None,
    backend: Annotated[Optional[list[str]], typer.Option("--backend", help="Only these backends (repeatable).")] = None,
    tune_trials: Annotated[Optional[int], typer.Option("--tune-trials", help="MetaSchedule trials (0 = untuned).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not use the stage cache.")] = False,
    retime: Annotated[bool, typer.Option("--retime", help="Measure the latencies and auto's routes again (a "
                                         "warm re-compile reuses the cached ones).")] = False,
    vecnormalize: Annotated[Optional[Path], typer.Option("--vecnormalize", help="SB3 agent: VecNormalize .pkl.")] = None,
    env: Annotated[Optional[str], typer.Option("--env", help="SB3 agent: gymnasium id for rollout checks.")] = None,
    baseline: Annotated[Optional[Path], typer.Option("--baseline", help="Then diff against this MODEL_DIR (the last "
                                                     "release), as 'rlopt diff BASELINE MODEL_DIR' does.")] = None,
    junit: JunitOption = None,
    json_out: JsonFlag = False,
) -> None:
    """Script -> ONNX -> TVM / ONNX Runtime / TensorRT -> verify -> benchmark -> write MODEL_DIR [-> diff]."""
    import contextlib

    from rlopt.compile import compile_agent, compile_recipe
    from rlopt.compile.cache import StageCache
    from rlopt.errors import UsageError
    from rlopt.logs import native_output_to_log, stdout_kept_for_json
    from rlopt.render import (
        ProgressReporter,
        native_log_note,
        parity_failure_table,
        stage_table,
        stderr,
        stdout,
        summary_table,
    )

    agent = recipe.suffix.lower() == ".zip"
    if junit is not None and baseline is None:
        raise UsageError(f"{junit}: --junit writes the diff's report; fix: add --baseline OLD_DIR, or drop --junit")
    if baseline is not None:  # a missing or corrupt baseline fails now, not after the compile
        from rlopt.tools.diff.pair import read_checked
        from rlopt.tools.diff.report import check_writable

        if output is not None and output.resolve() == baseline.resolve():
            raise UsageError(f"{baseline}: --baseline is the MODEL_DIR this compile replaces (-o); fix: compile into "
                             "another -o, or copy the release elsewhere first")
        read_checked(baseline)
        check_writable(junit)
    if not agent and (vecnormalize is not None or env is not None):
        raise UsageError(f"{recipe}: --vecnormalize / --env go with an agent .zip; fix: put them in the recipe "
                         "(model.vecnormalize, verify.rollout.env)")
    with native_output_to_log("compile") as log, ProgressReporter() as reporter, \
            (stdout_kept_for_json() if json_out else contextlib.nullcontext()):
        options: dict[str, Any] = {"backends": backend, "overrides": _tuning(tune_trials), "reporter": reporter,
                                   "cache": StageCache(enabled=not no_cache), "retime": retime}
        result = (compile_agent(recipe, output, vecnormalize=vecnormalize, env=env, **options) if agent
                  else compile_recipe(recipe, output, **options))
    document = {"model_dir": str(result.model_dir), "passed": result.passed, "failures": result.failures,
                "seconds": round(result.seconds, 2), "stages": [list(r) for r in reporter.rows],
                "manifest": result.manifest.model_dump(mode="json")}
    if json_out and (baseline is None or not result.passed):
        print_json(document)
    elif not json_out:
        stdout.print(stage_table(reporter.rows))
        stdout.print(summary_table(result.manifest))
        stdout.print(f"wrote {result.model_dir} in {result.seconds:.1f} s")
    native_log_note(log)
    for warning in result.warnings:
        stderr.print(f"[yellow]warning[/] {warning}", markup=True, highlight=False)
    if not result.passed:
        stderr.print(parity_failure_table(result.manifest))
        exit_failed(result.failures, "diff against --baseline not run: the compile failed verification"
                    if baseline is not None else None)
    if baseline is not None:
        from rlopt.cli.diff import show_diff
        from rlopt.render.diff import diff_progress
        from rlopt.tools.diff import run_diff

        with native_output_to_log("diff") as log, diff_progress(stderr) as progress, \
                (stdout_kept_for_json() if json_out else contextlib.nullcontext()):
            report = run_diff(baseline, result.model_dir, progress=progress)
        native_log_note(log)
        show_diff(report, junit, document | {"diff": report.model_dump(mode="json")} if json_out else None)


@app.command("refit")
def refit_command(
    model_dir: Annotated[Path, typer.Argument(help="A MODEL_DIR compiled by 'rlopt compile'.")],
    checkpoint: Annotated[Path, typer.Option("--checkpoint", help="New weights: a state_dict .pt / .safetensors, "
                                             "or a new zip of the same SB3 agent.")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="Write here (default: replace MODEL_DIR).")] = None,
    vecnormalize: Annotated[Optional[Path], typer.Option("--vecnormalize", help="SB3 agent: new VecNormalize .pkl.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Replace every artifact's weights without recompiling, re-verify every backend, report the policy drift."""
    import contextlib

    from rlopt.logs import stdout_kept_for_json
    from rlopt.refit import refit_model_dir
    from rlopt.render import stdout

    with stdout_kept_for_json() if json_out else contextlib.nullcontext():
        result = refit_model_dir(model_dir, checkpoint, output, vecnormalize=vecnormalize)
    drift = {name: network.drift.model_dump(mode="json") for name, network in result.manifest.networks.items()
             if network.drift is not None}
    if json_out:
        print_json({"model_dir": str(result.model_dir), "passed": result.passed, "failures": result.failures,
                     "seconds": round(result.seconds, 2), "refit_of": result.manifest.refit_of, "drift": drift,
                     "manifest": result.manifest.model_dump(mode="json")})
    else:
        for name, values in drift.items():
            agree = "" if values["argmax_agree"] is None else f", argmax agreement {values['argmax_agree']:.3f}"
            stdout.print(f"{name}: drift KL(old || new) mean {values['kl_mean']:.3g}, max {values['kl_max']:.3g}{agree}")
        if result.passed:
            stdout.print(f"refitted {result.model_dir} in {result.seconds:.2f} s")
    if not result.passed:
        exit_failed(result.failures, "nothing was replaced")


def _tuning(trials: int | None) -> dict[str, dict[str, Any]] | None:
    """--tune-trials: TVM's MetaSchedule budget (like `rlopt tune`, TVM's by definition), as a recipe override."""
    from rlopt.errors import UsageError

    if trials is None:
        return None
    if trials < 0:
        raise UsageError("--tune-trials must be >= 0")
    return {"tvm": {"tune_trials": trials}}
