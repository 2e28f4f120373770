"""The project's benchmark, by one protocol: `rlopt auto` against ONNX Runtime's best, on the bundled recipes (tuned)
and on users' models (untuned: coverage-matrix architectures, an SB3-style MLP, a PPO zip).

The protocol (docs/benchmarks.md says why each part is there):
- every model is compiled once (`rlopt compile --no-cache`, a fresh process; scripts/bench_models.py);
- a run benches every model in a fresh `rlopt bench` process (this script's `--one`), where each candidate
  lives in its own worker process: `rlopt auto`, PyTorch eager (or SB3's `predict` for an agent zip's actor),
  ONNX Runtime at 1 and at all threads, and an A/A twin of each ONNX Runtime session;
- per shape, K interleaved rounds (one block of calls per candidate per round, order shuffled each round);
  a ratio is the median over rounds of the per-round ratio of block medians (rlopt.tools.bench.protocol);
- R runs, one after the other over all models; each row reports the median over runs, the spread (min-max of
  the per-run ratios) and the done-when verdict;
- with the default policy and the atari CNN among the models, the serving view (scripts/bench_serving.py:
  `rlopt serve` batched against --max-batch 1, `rlopt.Batcher` against a shared Session, a soak, the checks).
Writes `--out` (JSON: every run's full report and the rows) and rewrites `--doc` (docs/benchmarks.md) with this
invocation's table set on top. A default run (R = 3, all models) takes about 20 minutes on a quiet 2-core
machine; `--quick` (R = 1, fewer rounds, a few models) is a smoke run.

usage: python scripts/bench.py [--runs R] [--rounds K] [--quick] [--out FILE] [--doc FILE] [--no-doc]
                               [--work-dir DIR] [MODEL ...]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_doc import collect_rows, default_policy_spread, table_set, write_doc  # noqa: E402
from bench_limits import measure_limits  # noqa: E402
from bench_models import QUICK, Model, known_models, prepare  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "benchmarks.md"
RUNS, ROUNDS, QUICK_ROUNDS = 3, 40, 12


def bench_once(model: Model, rounds: int, seed: int | None) -> tuple[dict[str, Any] | None, str | None]:
    """One `rlopt bench` of the model in a fresh process (this script's --one): its report, or why there is none.
    Without a seed the process draws its own (recorded in the report): the runs' round orders are independent."""
    command = [sys.executable, str(Path(__file__).resolve()), "--one", str(model.model_dir), "--rounds", str(rounds)]
    if seed is not None:
        command += ["--seed", str(seed)]
    if model.recipe is not None:
        command += ["--recipe", str(model.recipe)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=1800)
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return None, f"bench exit {done.returncode}: {lines[-1] if lines else '?'}"
    last = (done.stdout.strip().splitlines() or [""])[-1]  # a native library may have printed before the report
    try:
        return json.loads(last), None
    except json.JSONDecodeError:
        return None, f"bench printed no report: {last[:200]!r}"


def one(model_dir: Path, recipe: Path | None, rounds: int, seed: int | None) -> int:
    """`--one`: the protocol's candidate set on every network of MODEL_DIR, the report as JSON on stdout."""
    from rlopt.tools.bench import run_bench

    report = run_bench(model_dir, recipe=recipe, rounds=rounds, protocol=True, torch_compile=False, seed=seed,
                       progress=lambda line: print(f"[bench]   {line}", file=sys.stderr))
    print(report.model_dump_json())
    return 0


def commit() -> str:
    done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT)
    dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True, text=True,
                           cwd=ROOT).stdout.strip()
    return (done.stdout.strip() or "unknown") + ("+dirty" if dirty else "")


def machine_line() -> str:
    """CPU, cores, GPU and the versions that matter, in one line."""
    from rlopt.backends import tool_versions
    from rlopt.machine import machine_facts

    facts, versions = machine_facts(), tool_versions()
    tools = ", ".join(f"{name} {version}" for name, version in versions.items() if version)
    return (f"{facts['cpu']}, {facts['cores']} cores, {'a GPU' if facts['gpu'] else 'no GPU'}, "
            f"Python {facts['python']}; {tools}")


def auto_facts(model_dir: Path) -> dict[str, dict[str, Any]]:
    """What compile chose for `auto` (read before the work dir is removed): per network, the backend each shape
    label routes to (`auto_routes`: the manifest's facts.route.routes) and compile's reason with the latencies it
    chose from (`auto_choice`: facts.route.choice); both empty when the model did not compile."""
    from rlopt.manifest import read_manifest

    if not (model_dir / "manifest.json").is_file():
        return {"auto_routes": {}, "auto_choice": {}}
    networks = read_manifest(model_dir).networks
    routes = {name: r.facts.route for name, r in networks.items()}
    return {"auto_routes": {name: dict(route.routes) if route else {} for name, route in routes.items()},
            "auto_choice": {name: route.choice.as_dict() if route and route.choice else {}
                            for name, route in routes.items()}}


REFIT_LATENCY_ROUNDS = 8  # the latency check's interleaved rounds: about a minute of benching


def refit_section(models: list[Model], work_dir: Path, runs: int) -> tuple[Any, str | None]:
    """Refit against a cold compile of the default recipe (scripts/bench_refit.py in its own process, so this
    process stays free of torch), when the default recipe is among the models; its JSON and a Markdown table,
    with the refitted MODEL_DIR's latency against two fresh compiles per backend and shape."""
    if not any(m.name == "policy-value-heads" for m in models):
        return None, None
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("bench_refit.py")), "--runs", str(runs),
                           "--latency-rounds", str(REFIT_LATENCY_ROUNDS), "--latency-runs", str(runs),
                           "--work-dir", str(work_dir / "refit")],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-400:]}, f"Refit: the measurement failed: {done.stderr.strip()[-200:]}"
    refit = json.loads(done.stdout)
    reload = ", ".join(f"{name} {ms:.0f} ms" for name, ms in refit["reload_median_ms"].items())
    markdown = "\n".join([
        "### Refit against a cold compile (default recipe, medians)", "",
        f"Backends: {', '.join(refit['backends'])}; {refit['runs']} runs, each command in its own process.", "",
        "| measure | median | goal |", "|---|---|---|",
        f"| cold `rlopt compile --json` seconds | {refit['compile_cold_median_s']:.2f} s | |",
        f"| `rlopt refit --json` seconds | {refit['refit_cli_median_s']:.2f} s | |",
        f"| refit / cold compile | {refit['refit_over_compile']:.3f} | <= 0.2 |",
        f"| `rlopt.refit` in a warm process | {refit['refit_in_process_median_s']:.3f} s | <= 0.5 s |",
        f"| `Session.reload` | {reload} | <= 200 ms |"])
    return refit, markdown + refit_latency_markdown(refit.get("latency"))


def refit_latency_markdown(latency: dict[str, Any] | None) -> str:
    """The latency check as a table: per network, backend and shape, refitted / fresh1 against fresh2 / fresh1."""
    if not latency:
        return ""
    lines = ["", "", "### Refitted MODEL_DIR latency against two fresh compiles (default recipe)", "",
             f"Per shape, {latency.get('runs', 1)} runs of {latency['rounds']} interleaved rounds, each candidate in its "
             f"own process (fresh processes each run); ratios paired per round, median over rounds, then median over "
             f"runs. Within = refitted / fresh1 lies between 1 and fresh2 / fresh1 (within 5%: that interval "
             f"widened by the protocol's 5% tolerance). Files unlike fresh1: those that compute the shape (TVM: the "
             f"shape's own library and the params; else the artifact and what loads with it) whose sha256 differs "
             f"between the refitted MODEL_DIR and fresh1, and the facts that configure the runner that differ; where "
             f"there are none the verdict is 'same bytes' (the timing's own verdict in parentheses: the protocol's noise, "
             f"since identical code at one shape cannot be slower than itself). Passed (nothing outside): "
             f"{'yes' if latency['passed'] else 'no'}."
             + "".join(f" {name}: {', '.join(record['not_compared'])} not built, not compared."
                       for name, record in latency["networks"].items() if record.get("not_compared")), "",
             "| network | backend | shape | fresh1 us | refitted / fresh1 | per run | fresh2 / fresh1 | per run | verdict "
             "| files unlike fresh1 |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for network, record in latency["networks"].items():
        for shape in record["shapes"]:
            dims = "x".join(str(d) for dims in shape["shape"].values() for d in dims)
            for row in shape["backends"]:
                if "refit_over_fresh1" not in row:
                    lines.append(f"| {network} | {row['backend']} | {shape['point']} {dims} | | | | | | "
                                 f"{row['verdict']} | |")
                    continue
                per_run = {key: " ".join(f"{x:.2f}" for x in row.get(f"{key}_runs", [])) for key in
                           ("refit_over_fresh1", "fresh2_over_fresh1")}
                verdict = row["verdict"] + (f" (timing: {row['timing_verdict']})" if "timing_verdict" in row else "")
                unlike = ", ".join(row.get("files_unlike_fresh1", [])) or "none"
                lines.append(f"| {network} | {row['backend']} | {shape['point']} {dims} | {row['fresh1_us']:.1f} | "
                             f"{row['refit_over_fresh1']:.3f} | {per_run['refit_over_fresh1']} | "
                             f"{row['fresh2_over_fresh1']:.3f} | {per_run['fresh2_over_fresh1']} | {verdict} | {unlike} |")
    return "\n".join(lines)


def serving_section(models: list[Model], work_dir: Path, runs: int, quick: bool) -> tuple[Any, str | None]:
    """The serving view (scripts/bench_serving.py in its own process; every server, load and in-process candidate in
    a process of its own), when the default policy and the atari CNN are among the models: its JSON and Markdown."""
    compiled = {m.name: m.model_dir for m in models if (m.model_dir / "manifest.json").is_file()}
    if not {"policy-value-heads", "atari-cnn"} <= set(compiled):
        return None, None
    serving_dir = work_dir / "serving"
    serving_dir.mkdir(parents=True, exist_ok=True)
    for name in ("policy-value-heads", "atari-cnn"):
        if not (serving_dir / name).exists():
            (serving_dir / name).symlink_to(compiled[name].resolve())
    done = subprocess.run([sys.executable, str(Path(__file__).with_name("bench_serving.py")), "--runs", str(runs),
                           "--work-dir", str(serving_dir), *(["--quick"] if quick else [])],
                          capture_output=True, text=True)
    if done.returncode != 0:
        return {"error": done.stderr.strip()[-400:]}, f"Serving: the measurement failed: {done.stderr.strip()[-200:]}"
    serving = json.loads(done.stdout.strip().splitlines()[-1])
    return serving, serving["markdown"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="*", help=f"models to bench (default: all): {', '.join(known_models())}")
    parser.add_argument("--runs", type=int, default=None, help=f"R runs (default {RUNS}; --quick: 1)")
    parser.add_argument("--rounds", type=int, default=None, help=f"K rounds per shape (default {ROUNDS}; "
                                                                 f"--quick: {QUICK_ROUNDS})")
    parser.add_argument("--quick", action="store_true", help=f"smoke run: R = 1, K = {QUICK_ROUNDS}, models "
                                                             f"{', '.join(QUICK)} unless named")
    parser.add_argument("--out", type=Path, default=Path("bench-results.json"))
    parser.add_argument("--doc", type=Path, default=DOC, help="the Markdown file to rewrite")
    parser.add_argument("--no-doc", action="store_true", help="write only --out")
    parser.add_argument("--work-dir", type=Path, default=None, help="keep the compiled MODEL_DIRs here")
    parser.add_argument("--seed", type=int, default=None, help="replay a run's round orders: run r of every model "
                        "uses SEED + r (default: each bench draws its own, recorded in its report)")
    parser.add_argument("--one", type=Path, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--recipe", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    runs = args.runs or (1 if args.quick else RUNS)
    rounds = args.rounds or (QUICK_ROUNDS if args.quick else ROUNDS)
    if runs < 1 or rounds < 1:
        parser.error(f"--runs {runs} / --rounds {rounds}: both must be >= 1")
    if args.one is not None:
        return one(args.one, args.recipe, rounds, args.seed)
    names = args.models or (QUICK if args.quick else known_models())
    unknown = [n for n in names if n not in known_models()]
    if unknown:
        parser.error(f"unknown model(s) {', '.join(unknown)}; fix: name some of {', '.join(known_models())}")
    return protocol(names, runs, rounds, args)


def protocol(names: list[str], runs: int, rounds: int, args: argparse.Namespace) -> int:
    started = time.perf_counter()
    load_start = [round(v, 2) for v in os.getloadavg()]
    work_dir = args.work_dir or Path(tempfile.mkdtemp(prefix="rlopt-bench-"))
    try:
        work_dir.mkdir(parents=True, exist_ok=True)
        limits = measure_limits(work_dir)
        models = []
        for name in names:
            print(f"[bench] compiling {name}", file=sys.stderr)
            models.append(prepare(name, work_dir))
            print(f"[bench] {name}: exit {models[-1].compile_exit} in {models[-1].compile_s:.1f} s", file=sys.stderr)
        reports: dict[str, list[dict[str, Any]]] = {m.name: [] for m in models}
        errors: dict[str, list[str]] = {m.name: [] for m in models}
        for run in range(runs):
            for model in models:
                if model.compile_error and not (model.model_dir / "manifest.json").is_file():
                    continue
                print(f"[bench] run {run + 1}/{runs}: {model.name}", file=sys.stderr)
                report, error = bench_once(model, rounds, None if args.seed is None else args.seed + run)
                if report is not None:
                    reports[model.name].append(report)
                else:
                    errors[model.name].append(f"run {run + 1}: {error}")
        refit, refit_markdown = refit_section(models, work_dir, runs)
        serving, serving_markdown = serving_section(models, work_dir, runs, bool(args.quick))
        chosen = {m.name: auto_facts(m.model_dir) for m in models}
    finally:
        if args.work_dir is None:
            shutil.rmtree(work_dir, ignore_errors=True)
    model_json = [m.to_json() | {"runs": reports[m.name], "run_errors": errors[m.name]} | chosen[m.name]
                  for m in models]
    rows = collect_rows(model_json)
    results = {
        "kind": "rlopt-bench-protocol", "schema_version": 2,
        "created_at": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "commit": commit(),
        "machine_line": machine_line(), "load_average_at_start": load_start,
        "load_average_at_end": [round(v, 2) for v in os.getloadavg()],
        "protocol": {"runs": runs, "rounds": rounds, "quick": bool(args.quick), "seed": args.seed}, "limits": limits,
        "models": model_json, "rows": rows, "default_policy_spread": default_policy_spread(rows),
        "refit": refit, "refit_markdown": refit_markdown, "serving": serving, "serving_markdown": serving_markdown,
        "seconds": round(time.perf_counter() - started, 1)}
    tmp = args.out.with_name(f".{args.out.name}.tmp")
    tmp.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    tmp.replace(args.out)
    markdown = table_set(results, rows)
    if not args.no_doc:
        write_doc(args.doc, markdown)
    print(markdown)
    print(f"[bench] wrote {args.out}{'' if args.no_doc else f' and {args.doc}'} in {results['seconds']:.0f} s",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
