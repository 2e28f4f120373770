"""The `rlopt` command: typer commands that parse flags, call one library function, and render."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, Optional

import typer

from rlopt.errors import RloptError

app = typer.Typer(no_args_is_help=True, add_completion=False, pretty_exceptions_enable=False,
                  help="Compile RL policy/value networks into fast, verified, deployable artifacts.")

JsonFlag = Annotated[bool, typer.Option("--json", help="Print exactly one JSON document on stdout.")]


def _print_json(document: object) -> None:
    sys.stdout.write(json.dumps(document, indent=2) + "\n")


@app.command("compile")
def compile_command(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML (contract section 1), or an SB3 agent .zip.")],
    output: Annotated[Optional[Path], typer.Option("-o", "--output", help="MODEL_DIR (default artifacts/<name>).")] = None,
    backend: Annotated[Optional[list[str]], typer.Option("--backend", help="Only these backends (repeatable).")] = None,
    tune_trials: Annotated[Optional[int], typer.Option("--tune-trials", help="MetaSchedule trials (0 = untuned).")] = None,
    no_cache: Annotated[bool, typer.Option("--no-cache", help="Do not use the stage cache.")] = False,
    vecnormalize: Annotated[Optional[Path], typer.Option("--vecnormalize", help="SB3 agent: VecNormalize .pkl.")] = None,
    env: Annotated[Optional[str], typer.Option("--env", help="SB3 agent: gymnasium id for rollout checks.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """Script -> ONNX -> TVM / ONNX Runtime / TensorRT -> verify -> benchmark -> write MODEL_DIR."""
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
    if not agent and (vecnormalize is not None or env is not None):
        raise UsageError(f"{recipe}: --vecnormalize / --env go with an agent .zip; fix: put them in the recipe "
                         "(model.vecnormalize, verify.rollout.env)")
    with native_output_to_log("compile") as log, ProgressReporter() as reporter, \
            (stdout_kept_for_json() if json_out else contextlib.nullcontext()):
        options: dict[str, Any] = {"backends": backend, "tune_trials": tune_trials, "reporter": reporter,
                                   "cache": StageCache(enabled=not no_cache)}
        result = (compile_agent(recipe, output, vecnormalize=vecnormalize, env=env, **options) if agent
                  else compile_recipe(recipe, output, **options))
    if json_out:
        _print_json({"model_dir": str(result.model_dir), "passed": result.passed, "failures": result.failures,
                     "seconds": round(result.seconds, 2), "stages": [list(r) for r in reporter.rows],
                     "manifest": result.manifest.model_dump(mode="json")})
    else:
        stdout.print(stage_table(reporter.rows))
        stdout.print(summary_table(result.manifest))
        stdout.print(f"wrote {result.model_dir} in {result.seconds:.1f} s")
    native_log_note(log)
    for warning in result.warnings:
        stderr.print(f"[yellow]warning[/] {warning}", markup=True, highlight=False)
    if not result.passed:
        stderr.print(parity_failure_table(result.manifest))
        _exit_failed(result.failures)


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
        _print_json({"model_dir": str(result.model_dir), "passed": result.passed, "failures": result.failures,
                     "seconds": round(result.seconds, 2), "refit_of": result.manifest.refit_of, "drift": drift,
                     "manifest": result.manifest.model_dump(mode="json")})
    else:
        for name, values in drift.items():
            agree = "" if values["argmax_agree"] is None else f", argmax agreement {values['argmax_agree']:.3f}"
            stdout.print(f"{name}: drift KL(old || new) mean {values['kl_mean']:.3g}, max {values['kl_max']:.3g}{agree}")
        if result.passed:
            stdout.print(f"refitted {result.model_dir} in {result.seconds:.2f} s")
    if not result.passed:
        _exit_failed(result.failures, "nothing was replaced")


def _exit_failed(failures: list[str], note: str | None = None) -> None:
    """Each failure as one FAIL line on stderr, then `note`; exit 1 (the contract's parity-failure code)."""
    from rlopt.render import stderr

    for failure in failures:
        stderr.print(f"[red]FAIL[/] {failure}")
    if note:
        stderr.print(note)
    raise typer.Exit(1)


@app.command("verify")
def verify_command(model_dir: Annotated[Path, typer.Argument(help="A compiled MODEL_DIR.")],
                   json_out: JsonFlag = False) -> None:
    """Re-check the sha256 of every artifact and re-run parity against the recorded reference."""
    from rlopt.render import stdout, verify_table
    from rlopt.verify import verify_model_dir

    report = verify_model_dir(model_dir)
    if json_out:
        _print_json(report.as_json())
    else:
        stdout.print(verify_table(report))
    if not report.passed:
        _exit_failed([f.detail if f.parity is None else f"{f.network}/{f.subject}: {f.detail}"
                      for f in report.findings if not f.ok])


@app.command("inspect")
def inspect_command(model_dir: Annotated[Path, typer.Argument(help="A compiled MODEL_DIR.")],
                    json_out: JsonFlag = False) -> None:
    """Human summary of a MODEL_DIR's manifest."""
    from rlopt.manifest import read_manifest
    from rlopt.render import stdout, summary_table
    from rlopt.runtime import unbucketed_variant

    manifest = read_manifest(model_dir)
    if json_out:
        _print_json(manifest.model_dump(mode="json"))
        return
    stdout.print(f"[bold]{manifest.name}[/]  rlopt {manifest.rlopt_version}  created {manifest.created_at}")
    stdout.print("versions: " + ", ".join(f"{k} {v}" for k, v in manifest.versions.items() if v))
    stdout.print(f"machine: {manifest.machine.get('cpu')} ({manifest.machine.get('cores')} cores)")
    for name, network in manifest.networks.items():
        shapes = ", ".join(f"{n} {p.dtype} min {p.min} opt {p.opt} max {p.max}" for n, p in network.inputs.items())
        stdout.print(f"[bold]{name}[/] ({network.kind}, {network.precision}): {shapes} -> {network.outputs}; "
                     f"selected: {network.selected}")
        routes = network.facts.get("auto_routes")
        if routes:
            stdout.print("  auto: " + ", ".join(f"{shape} -> {backend}" for shape, backend in routes.items()),
                         markup=False)
            why = network.facts.get("auto_choice", {}).get("reason")
            if why:
                stdout.print(f"  auto chosen: {why}", markup=False)
        for backend, record in network.artifacts.items():
            notes = record.facts.get("fused_kernels")
            if notes:
                stdout.print(f"  {backend}: fused kernels {', '.join(notes)}")
            if record.facts.get("tuning_summary"):
                stdout.print(f"  {backend}: {record.facts['tuning_summary']}, {record.facts.get('num_threads')} "
                             f"thread(s), target {record.facts.get('target')}", markup=False)
            serving = unbucketed_variant(record.facts)
            if serving is not None:
                stdout.print(f"  {backend}: shapes without their own library: {OTHER_SHAPES[serving]}"
                             + _padding_note(record.facts, serving), markup=False)
            if record.facts.get("notice"):
                stdout.print(f"  {backend}: [yellow]{record.facts['notice']}[/]")
    stdout.print(summary_table(manifest))


OTHER_SHAPES = {"padded": "zero-padded into the smallest bigger tuned library", "dynamic": "the dynamic library"}


def _padding_note(facts: dict[str, Any], serving: str) -> str:
    """Why a TVM artifact does not pad, when it does not."""
    gate = facts.get("variant_parity", {}).get("padded")
    if serving == "padded" or gate is None:
        return ""
    if not gate.get("passed"):
        detail = gate.get("error") or f"max_abs {gate.get('max_abs')}"
        return f" (padding failed the parity gate: {detail})"
    return " (padding does not reach every shape: a varying dim that no output follows)"


@app.command("warmup")
def warmup_command(
    profile: Annotated[Path, typer.Option("--profile", help="Warmup profile JSON (contract section 6).")],
    model_dir: Annotated[Optional[Path], typer.Argument(help="A compiled MODEL_DIR (or --model_dir).")] = None,
    model_dir_option: Annotated[Optional[Path], typer.Option("--model_dir", "--model-dir",
                                                             help="Same as MODEL_DIR.")] = None,
    duration: Annotated[Optional[float], typer.Option("--duration", help="Seconds under load (default: the "
                                                      "profile's duration_s).")] = None,
    concurrency: Annotated[Optional[int], typer.Option("--concurrency", help="Threads sending requests (default: "
                                                       "the profile's concurrency).")] = None,
    backend: Annotated[str, typer.Option("--backend", help="auto (fastest verified) or one backend.")] = "auto",
    json_out: JsonFlag = False,
) -> None:
    """Drive a profile's request mix from N threads: cold vs steady latency, consistency under load, SLO."""
    from rich.markup import escape

    from rlopt.errors import UsageError
    from rlopt.logs import native_output_to_log
    from rlopt.render import native_log_note, stderr, stdout
    from rlopt.render.warmup import monitor_for, report_table
    from rlopt.tools.warmup.driver import run_warmup

    if model_dir is not None and model_dir_option is not None and model_dir != model_dir_option:
        raise UsageError(f"MODEL_DIR {model_dir} and --model_dir {model_dir_option} differ; fix: give one of them")
    target = model_dir or model_dir_option
    if target is None:
        raise UsageError("no MODEL_DIR; fix: rlopt warmup MODEL_DIR --profile P.json (or --model_dir MODEL_DIR)")
    with native_output_to_log("warmup") as log, monitor_for(stderr) as monitor:
        result = run_warmup(target, profile, duration_s=duration, concurrency=concurrency, backend=backend,
                            monitor=monitor)
    report = result.report
    if json_out:
        _print_json(report.model_dump(mode="json"))
    else:
        stdout.print(report_table(report))
        if report.files:
            stdout.print(f"wrote {report.files['json']} and {report.files['png']}", markup=False)
    native_log_note(log)
    for failure in report.failures:
        stderr.print(f"[red]FAIL[/] {escape(failure)}")
    if result.files_error:
        raise UsageError(result.files_error)
    if not report.passed:
        raise typer.Exit(1)


@app.command("bench")
def bench_command(
    model_dir: Annotated[Path, typer.Argument(help="A compiled MODEL_DIR.")],
    network: Annotated[Optional[str], typer.Option("--network", help="Only this network (default: all).")] = None,
    recipe: Annotated[Optional[Path], typer.Option("--recipe", help="The recipe given to 'rlopt compile', for the "
                                                   "PyTorch eager and torch.compile baselines.")] = None,
    budget: Annotated[float, typer.Option("--budget", help="Seconds of timed rounds per shape.")] = 2.0,
    flops: Annotated[bool, typer.Option("--flops/--no-flops", help="Count FLOPs per shape for GFLOP/s "
                                        "(torch's FLOP counter; its first use takes seconds).")] = True,
    json_out: JsonFlag = False,
) -> None:
    """Latency of every built backend and the PyTorch / ONNX Runtime baselines, per profile shape, interleaved."""
    from rlopt.logs import native_output_to_log
    from rlopt.render import native_log_note, stderr, stdout
    from rlopt.render.bench import bench_progress, bench_tables
    from rlopt.tools.bench.driver import run_bench

    with native_output_to_log("bench") as log, bench_progress(stderr) as progress:
        report = run_bench(model_dir, network, recipe, budget_s=budget, progress=progress, count_flops=flops)
    if json_out:
        _print_json(report.model_dump(mode="json"))
    else:
        for table in bench_tables(report):
            stdout.print(table)
    native_log_note(log)


@app.command("tune")
def tune_command(
    recipe: Annotated[Path, typer.Argument(help="Recipe YAML; the database goes to <recipe>.tuning/ next to it.")],
    trials: Annotated[int, typer.Option("--trials", help="MetaSchedule trials per network per profile shape.")] = 64,
    time_budget: Annotated[Optional[float], typer.Option("--time-budget", help="Stop after S seconds (resumable).")] = None,
    network: Annotated[Optional[list[str]], typer.Option("--network", help="Only this network (repeatable).")] = None,
    rpc_tracker: Annotated[Optional[str], typer.Option("--rpc-tracker", help="HOST:PORT of a TVM RPC tracker.")] = None,
    rpc_key: Annotated[Optional[str], typer.Option("--rpc-key", help="Device key registered with the tracker.")] = None,
    json_out: JsonFlag = False,
) -> None:
    """MetaSchedule-tune every network at each profile shape; compile then applies the database without re-tuning."""
    from rlopt.render import stderr, stdout
    from rlopt.backends.tvm.measuring import RpcSpec
    from rlopt.tools.tune import tune_recipe
    from rlopt.tools.tune.progress import TuneProgress, result_table

    rpc = RpcSpec.parse(rpc_tracker, rpc_key) if rpc_tracker else None
    with TuneProgress(stderr) as progress:
        result = tune_recipe(recipe, trials=trials, time_budget_s=time_budget, rpc=rpc, networks=network,
                             reporter=progress)
    if json_out:
        _print_json(result.summary())
    else:
        stdout.print(result_table(result))


cache_app = typer.Typer(no_args_is_help=True, help="The stage cache ($RLOPT_CACHE, default ~/.cache/rlopt).")
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
def cache_info_command(json_out: JsonFlag = False) -> None:
    """Where the cache is, how many entries each stage has, and its size."""
    from rlopt.compile.cache import StageCache
    from rlopt.render import stdout

    info = StageCache().info()
    if json_out:
        _print_json(info)
        return
    stdout.print(f"{info['root']}: {info['bytes'] / 1e6:.1f} MB", markup=False)
    for stage, count in info["entries"].items():
        stdout.print(f"  {stage}: {count} entries", markup=False)


@cache_app.command("prune")
def cache_prune_command(json_out: JsonFlag = False) -> None:
    """Remove entries made by other stage code or other tool versions (they can never hit again)."""
    from rlopt.compile.cache import StageCache
    from rlopt.compile.network import entry_is_current, stage_code_versions
    from rlopt.render import stdout

    versions = stage_code_versions()
    removed = StageCache().prune(lambda stage, components: entry_is_current(stage, components, versions))
    if json_out:
        _print_json({"removed": removed})
        return
    stdout.print(f"removed {removed} entries made by other code or tool versions", markup=False)


@cache_app.command("clear")
def cache_clear_command() -> None:
    """Remove every cache entry."""
    from rlopt.compile.cache import StageCache
    from rlopt.render import stdout

    stdout.print(f"removed {StageCache().clear()} entries", markup=False)


@app.command("schema")
def schema_command(kind: Annotated[str, typer.Argument(help="recipe, profile or manifest.")]) -> None:
    """Print the JSON schema of a recipe, a warmup profile or a manifest (for editors and CI validation)."""
    from rlopt.schema import json_schema

    _print_json(json_schema(kind))


def _internal_error(exc: BaseException) -> str:
    """Write the traceback under the cache directory's logs/; returns the log's path."""
    import os
    import tempfile
    import traceback
    from datetime import datetime, timezone

    from rlopt.machine import cache_root

    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    name = f"internal-error-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}-{os.getpid()}.log"
    for folder in (cache_root() / "logs", Path(tempfile.gettempdir())):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(f"rlopt {' '.join(sys.argv[1:])}\n{text}", encoding="utf-8")
            return str(folder / name)
        except OSError:
            continue
    return "(no writable log directory)"


RUN_ONLY_COMMANDS = frozenset({"refit", "verify", "warmup"})


def main(argv: list[str] | None = None) -> None:
    """Entry point: user errors become one line on stderr and the contract's exit code; usage errors exit 2.

    Anything else is a bug in rlopt: one line saying so, the traceback in a log file, exit 3.
    As the process's own entry (argv from sys.argv), a command that only runs artifacts loads each backend's
    runtime alone (rlopt.backends.runtime_only_process); a call with `argv` leaves its process as it is.
    """
    if argv is None and next((a for a in sys.argv[1:] if not a.startswith("-")), None) in RUN_ONLY_COMMANDS:
        from rlopt.backends import runtime_only_process

        runtime_only_process()
    try:
        app(args=argv)
    except RloptError as exc:
        sys.stderr.write(f"rlopt: error: {exc}\n")
        sys.exit(exc.exit_code)
    except KeyboardInterrupt:
        sys.stderr.write("rlopt: interrupted; nothing was published\n")
        sys.exit(130)
    except Exception as exc:  # not a user's mistake: every one of those is an RloptError
        message = " ".join(str(exc).split())
        sys.stderr.write(f"rlopt: internal error (a bug in rlopt): {type(exc).__name__}: {message}; "
                         f"the traceback is in {_internal_error(exc)}\n")
        sys.exit(3)


if __name__ == "__main__":
    main()
