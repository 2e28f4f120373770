"""Are the manifest's latencies true? Each backend's p50 at each named shape, as compile recorded it, against what
`rlopt bench` measures for the same backend and shape (its `rlopt <backend>` candidate: `rlopt.load(...).run`,
warmed, in a process of its own).

This host's speed moves up to 2.5x within seconds (the same ONNX Runtime artifact in four worker processes timed in
interleaved rounds: every process within 3% of the others in each second, the seconds' medians 18, 45 and 18 us),
so one compile-then-bench pair cannot tell a wrong manifest from a move of the host. Each measurement is therefore
bracketed by an A/A pair: per recipe, `rlopt compile RECIPE --json`, then `rlopt bench DIR --json` (B0), then
--runs times `rlopt compile --retime` (the latency stage measures again, M_k) followed by a bench (B_k). Run k
compares M_k with the geometric mean of B_(k-1) and B_k, the benches right before and after it; it decides a row
only where those two agree within --max-ratio (else the host moved by more than the tolerance meanwhile, and the
run is reported as undecided for that row). A row passes when it is within --max-ratio in a majority of its
decided runs; a row no run decided is reported apart. The fresh compile's own latencies, against B0 alone, are
reported as run 0 and not counted. JSON on stdout (or --out). Exit 1 when any row is outside or undecided.

usage: python scripts/latency_check.py [--recipe R]... [--bundled] [--coverage [NAME ...]] [--work-dir DIR]
                                       [--runs 3] [--budget S] [--max-ratio 1.5] [--out FILE]
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
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # the coverage matrix's models live under tests/data
ENV = dict(os.environ, COLUMNS="200",  # this checkout's rlopt, whatever is installed
           PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))


def _rlopt(*args: str, cwd: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-m", "rlopt", *args, "--json"], capture_output=True, text=True, cwd=cwd,
                          env=ENV, timeout=3600)
    if proc.returncode not in (0, 1) or not proc.stdout.strip():
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise RuntimeError(f"rlopt {args[0]} exited {proc.returncode}: {lines[-1] if lines else ''}")
    return json.loads(proc.stdout)


def compile_recipe(recipe: Path, out: Path, retime: bool = False) -> Path:
    report = _rlopt("compile", str(recipe), "-o", str(out), *(["--retime"] if retime else []), cwd=recipe.parent)
    return Path(report["model_dir"])


def coverage_recipe(name: str, work: Path) -> Path:
    """The coverage matrix's recipe for architecture `name` (scripts/coverage.py), on the CPU backends."""
    import yaml

    from tests.data.models.coverage import recipe_for

    folder = work / name
    (folder / "models").mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "tests" / "data" / "models" / "coverage.py", folder / "models" / "coverage.py")
    recipe = folder / "recipe.yaml"
    recipe.write_text(yaml.safe_dump(recipe_for(name, ["torchscript", "onnxruntime", "tvm"]), sort_keys=False))
    return recipe


Key = tuple[str, str, str]  # network, backend, named shape


def bench_medians(model_dir: Path, budget: float) -> dict[Key, tuple[float, Any]]:
    """`rlopt bench DIR`'s median (us) and shape per (network, `rlopt <backend>` candidate's backend, named shape)."""
    bench = _rlopt("bench", str(model_dir), "--budget", str(budget), "--no-flops", cwd=model_dir.parent)
    return {(network["network"], r["candidate"].removeprefix("rlopt "), shape["point"]):
            (r["median_us"], shape["shape"])
            for network in bench["networks"] for shape in network["shapes"] for r in shape["results"]
            if r["candidate"].startswith("rlopt ") and r["candidate"] != "rlopt auto"}


def compare(model_dir: Path, before: dict[Key, tuple[float, Any]] | None, after: dict[Key, tuple[float, Any]],
            max_ratio: float) -> list[dict[str, Any]]:
    """One row per (network, backend, named shape) that compile timed and the benches ran: the manifest's p50
    against the geometric mean of the bench before and the bench after it (`before` None: the one after alone), and
    whether those two agree within `max_ratio` (`decided`)."""
    manifest = json.loads((model_dir / "manifest.json").read_text())
    rows = []
    for name, record in manifest["networks"].items():
        for backend, artifact in record["artifacts"].items():
            for point, latency in (artifact.get("latency_us") or {}).items():
                key = (name, backend, point)
                if key not in after or (before is not None and key not in before):
                    continue
                (late, shape), early = after[key], (before[key][0] if before is not None else None)
                bench_us = late if early is None else (early * late) ** 0.5
                aa = None if early is None else max(late / early, early / late)
                ratio = max(latency["p50"] / bench_us, bench_us / latency["p50"])
                rows.append({"name": manifest["name"], "network": name, "backend": backend, "point": point,
                             "shape": shape, "manifest_p50_us": latency["p50"], "bench_median_us": round(bench_us, 2),
                             "bench_aa": None if aa is None else round(aa, 3), "ratio": round(ratio, 3),
                             "decided": aa is None or aa <= max_ratio, "within": ratio <= max_ratio})
    return rows


def verdicts(runs: list[list[dict[str, Any]]], max_ratio: float) -> list[dict[str, Any]]:
    """One row per (model, network, backend, point) over the runs: the ratio and the benches' A/A in each, the median
    ratio of its decided runs, and whether it was within `max_ratio` in a majority of them (None: no run decided it;
    a row missing from a decided run counts as outside there)."""
    merged: dict[tuple, dict[str, Any]] = {}
    for rows in runs:
        for row in rows:
            key = (row["name"], row["network"], row["backend"], row["point"])
            entry = merged.setdefault(key, {k: row[k] for k in ("name", "network", "backend", "point", "shape")}
                                      | {"manifest_p50_us": [], "bench_median_us": [], "bench_aa": [], "ratios": [],
                                         "decided": []})
            for field in ("manifest_p50_us", "bench_median_us", "bench_aa", "decided"):
                entry[field].append(row[field])
            entry["ratios"].append(row["ratio"])
    for entry in merged.values():
        decided = [r for r, d in zip(entry["ratios"], entry["decided"]) if d]
        entry["ratio"] = round(statistics.median(decided or entry["ratios"]), 3)
        entry["within_runs"] = sum(r <= max_ratio for r in decided)
        counted = len(decided) + len(runs) - len(entry["ratios"])  # a run that lost the row counts it outside
        entry["decided_runs"] = counted
        entry["within"] = entry["within_runs"] * 2 > counted if counted else None
    return list(merged.values())


def check_recipe(recipe: Path, out: Path, args: argparse.Namespace, errors: list[str]
                 ) -> tuple[list[dict[str, Any]], list[list[dict[str, Any]]]]:
    """Run 0 (the fresh compile against the bench after it) and runs 1..--runs (a re-timed manifest between two
    benches) of one recipe; ([], []) with the reason in `errors` when a command fails."""
    try:
        model_dir = compile_recipe(recipe, out)
        before = bench_medians(model_dir, args.budget)
        fresh = compare(model_dir, None, before, args.max_ratio)
        runs = []
        for _ in range(max(1, args.runs)):
            compile_recipe(recipe, out, retime=True)
            after = bench_medians(model_dir, args.budget)
            runs.append(compare(model_dir, before, after, args.max_ratio))
            before = after
    except RuntimeError as exc:
        errors.append(f"{recipe}: {exc}")
        return [], []
    return fresh, runs


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, action="append", default=[])
    parser.add_argument("--bundled", action="store_true", help="every recipe in recipes/")
    parser.add_argument("--coverage", nargs="*", default=None, metavar="NAME",
                        help="the coverage matrix's architectures (all when none is named)")
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=3, help="re-timed manifests per recipe, each between two benches")
    parser.add_argument("--budget", type=float, default=2.0, help="rlopt bench --budget")
    parser.add_argument("--max-ratio", type=float, default=1.5)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="rlopt-latency-"))
    work.mkdir(parents=True, exist_ok=True)
    recipes = [r.resolve() for r in args.recipe]
    if args.bundled:
        recipes += sorted((ROOT / "recipes").glob("*.yaml"))
    if args.coverage is not None:
        from tests.data.models.coverage import ARCHITECTURES

        recipes += [coverage_recipe(name, work) for name in (args.coverage or list(ARCHITECTURES))]
    errors: list[str] = []
    fresh: list[dict[str, Any]] = []
    runs: list[list[dict[str, Any]]] = [[] for _ in range(max(1, args.runs))]
    for recipe in recipes:  # one recipe's commands back to back, so each bench pair brackets its manifest closely
        first, later = check_recipe(recipe, work / f"{recipe.parent.name}-{recipe.stem}", args, errors)
        fresh.extend(first)
        for rows, found in zip(runs, later):
            rows.extend(found)
    rows = verdicts(runs, args.max_ratio)
    outside = [r for r in rows if r["within"] is False]
    undecided = [r for r in rows if r["within"] is None]
    report = {"max_ratio": args.max_ratio, "budget_s": args.budget, "runs": len(runs), "rows": rows,
              "errors": errors, "worst": max(rows, key=lambda r: r["ratio"], default=None), "outside": outside,
              "undecided": undecided, "run_outside": [sum(not r["within"] for r in run) for run in runs],
              "run_undecided": [sum(not r["decided"] for r in run) for run in runs],
              "fresh_compile": {"rows": fresh, "outside": sum(not r["within"] for r in fresh)},
              "passed": not outside and not undecided and not errors and bool(rows)}
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
