"""Refit against recompiling: cold `rlopt compile --json` vs `rlopt refit --json` seconds, each in its own
process, plus the in-process `rlopt.refit` and `Session.reload` medians, and the refitted MODEL_DIR's latency
against two fresh compiles from the same new weights.

`measure_refit(recipe, work_dir, runs, latency_rounds)` is what scripts/bench.py calls; standalone it prints the
JSON (`--latency-only`: just the latency check). Only backends with a refit hook are compiled (the registry says
which), so every side builds the same artifacts. The new weights are the recipe's model with every
floating-point entry moved by 1% noise.

The latency check (`measure_refit_latency`): compile from weights A, refit to B, compile from B twice (each
`rlopt` command in its own process, with its own empty stage cache); then per network one `rlopt bench` run
(the bench protocol: every candidate in its own process, interleaved rounds) with the refitted MODEL_DIR's and
both fresh ones' backends as extra candidates, repeated `--latency-runs` times in fresh processes. Per backend and
profile shape it reports refitted / fresh1 and fresh2 / fresh1 (paired per round, median over rounds, then median
over runs, each run's ratio listed) and a verdict: "within" when refitted / fresh1 lies in
[min(1, spread), max(1, spread)], the spread being fresh2 / fresh1; "within 5%" when it lies in that interval
widened by the bench protocol's TOLERANCE (1.05, rlopt.tools.bench.protocol); else "outside". Each row also names
the files that compute the shape and differ between the refitted MODEL_DIR and fresh1 (`files_unlike`); with none,
the verdict is "same bytes" and the timing's own verdict is kept beside it. The check passes when no backend is
outside at any shape. Backends not built in all three MODEL_DIRs (TensorRT without a GPU)
are listed as not compared.

usage: python scripts/bench_refit.py [--runs 3] [--latency-rounds 8] [--latency-runs 3] [--latency-only] [--work-dir DIR]
                                    [RECIPE]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = ROOT / "recipes" / "policy_value_heads.yaml"


def _rlopt(*args: str, cache: Path) -> dict[str, Any]:
    """The real CLI in a fresh process with its own stage cache; its --json document."""
    env = dict(os.environ, RLOPT_CACHE=str(cache))
    done = subprocess.run([sys.executable, "-m", "rlopt", *args, "--json"], capture_output=True, text=True,
                          cwd=ROOT, env=env)
    if done.returncode != 0:
        raise SystemExit(f"rlopt {' '.join(args)} failed ({done.returncode}): {done.stderr.strip()}")
    return json.loads(done.stdout)


def refittable_backends(recipe: Path) -> list[str]:
    from rlopt.backends import BACKENDS
    from rlopt.recipe import load_recipe

    return [name for name in load_recipe(recipe).backends if BACKENDS[name].refit is not None]


def new_checkpoint(recipe: Path, path: Path, seed: int = 1) -> Path:
    """The recipe's model with every floating-point entry moved by 1% of its scale (a learner's update)."""
    import torch

    from rlopt.recipe import load_recipe
    from rlopt.user_model import build_model

    model, _ = build_model(load_recipe(recipe).model, recipe)
    generator = torch.Generator().manual_seed(seed)
    state = {k: v + 0.01 * v.abs().mean() * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
             for k, v in model.state_dict().items()}
    torch.save(state, path)
    return path


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


def measure_refit(recipe: Path | str, work_dir: Path | str, runs: int = 3, latency_rounds: int = 0,
                  latency_runs: int = 3) -> dict[str, Any]:
    """Per run: a cold compile (empty cache) and a refit of it, each `rlopt ... --json` in its own process;
    then in this process, after one warm-up call, `runs` timed `rlopt.refit` and `Session.reload` calls; then,
    with `latency_rounds`, the latency check on the first run's compile and refit."""
    import rlopt

    recipe, work_dir = Path(recipe).resolve(), Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    backends = refittable_backends(recipe)
    flags = [arg for name in backends for arg in ("--backend", name)]
    checkpoint = new_checkpoint(recipe, work_dir / "new.pt")
    compile_s: list[float] = []
    refit_s: list[float] = []
    for run in range(runs):
        base = work_dir / f"compiled-{run}"
        compiled = _rlopt("compile", str(recipe), "-o", str(base), *flags, cache=work_dir / f"cache-{run}")
        compile_s.append(compiled["seconds"])
        refitted = _rlopt("refit", str(base), "--checkpoint", str(checkpoint), "-o", str(work_dir / f"refit-{run}"),
                          cache=work_dir / f"cache-{run}")
        refit_s.append(refitted["seconds"])
    base = work_dir / "compiled-0"
    rlopt.refit(base, checkpoint, work_dir / "warm")  # warm-up: imports, the factory, first-call costs
    in_process: list[float] = []
    for run in range(runs):
        started = time.perf_counter()
        rlopt.refit(base, checkpoint, work_dir / "warm")
        in_process.append(time.perf_counter() - started)
    reload_ms: dict[str, float] = {}
    from rlopt.manifest import read_manifest

    for network in read_manifest(base).networks:
        with rlopt.load(base, network) as session:
            times = []
            for run in range(runs * 2):
                started = time.perf_counter()
                session.reload(work_dir / "warm" if run % 2 == 0 else base)
                times.append((time.perf_counter() - started) * 1e3)
        reload_ms[network] = round(statistics.median(times), 2)
    latency = (measure_refit_latency(recipe, work_dir, latency_rounds, latency_runs, refitted=work_dir / "refit-0",
                                     checkpoint=checkpoint) if latency_rounds else None)
    return {"recipe": recipe.name, "backends": backends, "runs": runs, "latency": latency,
            "compile_cold_seconds": compile_s, "refit_cli_seconds": refit_s,
            "compile_cold_median_s": _median(compile_s), "refit_cli_median_s": _median(refit_s),
            "refit_over_compile": round(statistics.median(refit_s) / statistics.median(compile_s), 3),
            "refit_in_process_median_s": _median(in_process), "reload_median_ms": reload_ms,
            "load_average": os.getloadavg()[0]}


def fresh_recipe(recipe: Path, checkpoint: Path, folder: Path) -> Path:
    """`recipe` with `model.checkpoint` = `checkpoint`, beside copies of what it reads relative to itself (its
    models/ and its `<name>.tuning` database): compiling it is compiling the original with the new weights."""
    import yaml

    folder.mkdir(parents=True, exist_ok=True)
    document = yaml.safe_load(recipe.read_text(encoding="utf-8"))
    document["model"]["checkpoint"] = str(checkpoint.resolve())
    for sibling in (recipe.parent / "models", recipe.with_suffix(".tuning")):
        if sibling.is_dir():
            shutil.copytree(sibling, folder / sibling.name, dirs_exist_ok=True)
    path = folder / recipe.name
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


def latency_verdicts(runs_rounds_us: list[dict[str, list[float]]], backends: list[str]) -> list[dict[str, Any]]:
    """Per backend at one shape, from each run's per-round medians: refitted / fresh1 and fresh2 / fresh1 (paired
    per round, median over rounds) per run, their medians over runs, and whether the first median lies within
    the spread of the two fresh compiles; a backend without all three candidates in every run says which lack.
    Runs are fresh processes: a process that stalls (benchmarks.md, the stall) moves one run's ratio, not the
    median."""
    from rlopt.tools.bench.protocol import TOLERANCE, paired_ratio

    rows = []
    for backend in backends:
        names = {side: f"{side} {backend}" for side in ("refitted", "fresh1", "fresh2")}
        missing = sorted({name for rounds_us in runs_rounds_us for name in names.values() if not rounds_us.get(name)})
        if missing:
            rows.append({"backend": backend, "verdict": f"not measured: no timings of {', '.join(missing)}"})
            continue
        refits = [paired_ratio(r[names["refitted"]], r[names["fresh1"]]) for r in runs_rounds_us]
        spreads = [paired_ratio(r[names["fresh2"]], r[names["fresh1"]]) for r in runs_rounds_us]
        refit, spread = statistics.median(refits), statistics.median(spreads)
        low, high = min(1.0, spread), max(1.0, spread)
        verdict = ("within" if low <= refit <= high else
                   "within 5%" if low / TOLERANCE <= refit <= high * TOLERANCE else "outside")
        fresh1 = statistics.median(statistics.median(r[names["fresh1"]]) for r in runs_rounds_us)
        rows.append({"backend": backend, "refit_over_fresh1": round(refit, 4), "fresh2_over_fresh1": round(spread, 4),
                     "refit_over_fresh1_runs": [round(x, 4) for x in refits],
                     "fresh2_over_fresh1_runs": [round(x, 4) for x in spreads],
                     "fresh1_us": round(fresh1, 2), "verdict": verdict})
    return rows


def measure_refit_latency(recipe: Path | str, work_dir: Path | str, rounds: int = 8, runs: int = 3, *,
                          refitted: Path | None = None, checkpoint: Path | None = None) -> dict[str, Any]:
    """The refitted MODEL_DIR against two fresh compiles from the same weights, per backend and profile shape
    (module docstring). `refitted` (with its `checkpoint`) reuses a refit already made from a cold compile."""
    recipe, work_dir = Path(recipe).resolve(), Path(work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    backends = refittable_backends(recipe)
    flags = [arg for name in backends for arg in ("--backend", name)]
    if refitted is None or checkpoint is None:
        checkpoint = new_checkpoint(recipe, work_dir / "new.pt")
        base, refitted = work_dir / "latency-a", work_dir / "latency-refit"
        _rlopt("compile", str(recipe), "-o", str(base), *flags, cache=work_dir / "cache-latency-a")
        _rlopt("refit", str(base), "--checkpoint", str(checkpoint), "-o", str(refitted),
               cache=work_dir / "cache-latency-a")
    recipe_b = fresh_recipe(recipe, checkpoint, work_dir / "recipe-b")
    sides = {"refitted": refitted}
    for index in (1, 2):
        sides[f"fresh{index}"] = work_dir / f"fresh-{index}"
        _rlopt("compile", str(recipe_b), "-o", str(sides[f"fresh{index}"]), *flags,
               cache=work_dir / f"cache-fresh-{index}")
    return compare_latency(sides, backends, rounds, runs)


def files_unlike(manifests: dict[str, Any], network: str, backend: str, point: str | None = None,
                 side: str = "fresh1") -> list[str]:
    """The files of `backend`'s artifact (itself and what loads with it: TVM's per-shape libraries and params; at
    `point`, only those that compute it: `ArtifactFacts.files_serving`) whose sha256 in the refitted MODEL_DIR
    differs from `side`'s, then the facts that configure its runner (all but measurements: `*_us`, `*_parity`) that
    differ. None listed: at that shape both run the same bytes the same way."""
    from rlopt.backends import facts_of

    def artifact(manifest: Any) -> Any:
        return manifest.networks[network].artifacts[backend]

    def files(manifest: Any) -> dict[str, str]:
        record = artifact(manifest)
        facts = facts_of(backend, record.facts)
        serving = facts.files_serving(point) if point is not None else None
        if serving is not None:
            return {ref.path: ref.sha256 for ref in serving}
        return {record.path: record.sha256, **{ref.path: ref.sha256 for ref in facts.companion_files()}}

    def unhashed(value: Any) -> Any:  # a file's hash and size are compared as files above
        if isinstance(value, dict):
            return {k: unhashed(v) for k, v in value.items() if k not in ("sha256", "bytes")}
        return [unhashed(v) for v in value] if isinstance(value, list) else value

    def settings(manifest: Any) -> dict[str, Any]:  # how the runner is configured; measurements left out
        return {key: unhashed(value) for key, value in artifact(manifest).facts.as_dict().items()
                if not key.endswith(("_us", "_parity"))}

    refitted, other = files(manifests["refitted"]), files(manifests[side])
    ran, side_ran = settings(manifests["refitted"]), settings(manifests[side])
    return sorted(Path(path).name for path in set(refitted) | set(other) if refitted.get(path) != other.get(path)) + \
        sorted(f"facts.{key}" for key in set(ran) | set(side_ran) if ran.get(key) != side_ran.get(key))


def same_bytes(row: dict[str, Any], unlike: list[str]) -> dict[str, Any]:
    """`row` with the files unlike fresh1; where there are none, the verdict is "same bytes" (the timing's own
    verdict kept as `timing_verdict`): no timing can make identical code at one shape slower than itself."""
    row = {**row, "files_unlike_fresh1": unlike}
    if not unlike and "refit_over_fresh1" in row:
        row["timing_verdict"], row["verdict"] = row["verdict"], "same bytes"
    return row


def compare_latency(sides: dict[str, Path], backends: list[str], rounds: int, runs: int = 3) -> dict[str, Any]:
    """The bench half of the latency check: `sides` names the MODEL_DIRs 'refitted', 'fresh1' and 'fresh2'; each
    network is benched `runs` times, every time in fresh processes."""
    from rlopt.manifest import read_manifest
    from rlopt.tools.bench import CandidateSpec, run_bench

    networks: dict[str, Any] = {}
    manifests = {side: read_manifest(folder) for side, folder in sides.items()}
    for network in manifests["refitted"].networks:
        built = [backend for backend in backends if all(
            (record := manifest.networks[network].artifacts.get(backend)) is not None and record.verified
            for manifest in manifests.values())]
        extra = [CandidateSpec(f"{side} {backend}", "rlopt", f"rlopt.load({folder.name}, backend='{backend}').run",
                               "rlopt", str(folder), network, backend=backend)
                 for side, folder in sides.items() for backend in built]
        benches = [run_bench(sides["refitted"], network, rounds=rounds, protocol=True, torch_compile=False,
                             extra_candidates=extra).networks[0] for _ in range(runs)]
        bench = benches[0]
        networks[network] = {
            "shapes": [{"point": shape.point, "shape": shape.shape, "rounds": shape.rounds,
                        "backends": [same_bytes(row, files_unlike(manifests, network, row["backend"], shape.point))
                                     for row in latency_verdicts([b.shapes[index].round_medians_us for b in benches],
                                                                 built)]}
                       for index, shape in enumerate(bench.shapes)],
            "not_compared": [backend for backend in backends if backend not in built],
            "skipped": [skip.model_dump() for skip in bench.skipped if skip.candidate in {s.name for s in extra}]}
    verdicts = [row["verdict"] for n in networks.values() for shape in n["shapes"] for row in shape["backends"]]
    return {"backends": backends, "rounds": rounds, "runs": runs, "networks": networks,
            "passed": bool(verdicts) and all(v.startswith("within") or v == "same bytes" for v in verdicts),
            "load_average": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", nargs="?", type=Path, default=DEFAULT_RECIPE)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--latency-rounds", type=int, default=0, help="rounds of the latency check (0: none)")
    parser.add_argument("--latency-runs", type=int, default=3, help="runs of the latency check, in fresh processes")
    parser.add_argument("--latency-only", action="store_true", help="only the latency check (default 8 rounds)")
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args()

    def measure(folder: Path) -> dict[str, Any]:
        if args.latency_only:
            return measure_refit_latency(args.recipe, folder, args.latency_rounds or 8, args.latency_runs)
        return measure_refit(args.recipe, folder, args.runs, args.latency_rounds, args.latency_runs)

    if args.work_dir is not None:
        result = measure(args.work_dir)
    else:
        with tempfile.TemporaryDirectory(prefix="rlopt-bench-refit-") as folder:
            result = measure(Path(folder))
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
