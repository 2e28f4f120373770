"""`rlopt warmup`, `rlopt bench` and `rlopt tune`: the commands that run or tune artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rlopt.cli.base import JsonFlag, app, print_json


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
    url: Annotated[Optional[str], typer.Option("--url", help="Drive a running server of MODEL_DIR instead "
                                               "(http://HOST:PORT or grpc://HOST:PORT, as rlopt serve listens); "
                                               "probes are still checked against rlopt.load here.")] = None,
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
                            monitor=monitor, url=url)
    report = result.report
    if json_out:
        print_json(report.model_dump(mode="json"))
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
        print_json(report.model_dump(mode="json"))
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
    from rlopt.render.tune import result_table
    from rlopt.tools.tune.progress import TuneProgress

    rpc = RpcSpec.parse(rpc_tracker, rpc_key) if rpc_tracker else None
    with TuneProgress(stderr) as progress:
        result = tune_recipe(recipe, trials=trials, time_budget_s=time_budget, rpc=rpc, networks=network,
                             reporter=progress)
    if json_out:
        print_json(result.summary())
    else:
        stdout.print(result_table(result))
