"""Are the manifest's latencies true? Each backend's p50 at each named shape, as compile recorded it, against what
`rlopt bench` measures for the same backend and shape (its `rlopt <backend>` candidate: `rlopt.load(...).run`,
warmed, in a process of its own).

Each recipe is compiled by the real CLI (`rlopt compile RECIPE --json`) and benched right after
(`rlopt bench DIR --json`), so the two measurements are minutes, not the whole run, apart; a MODEL_DIR is taken as it
is. This host's speed drifts up to ~1.8x between phases of a few minutes, which no single compile-then-bench pair can
tell from a wrong manifest. So the pair is repeated --runs times (each pass goes over every recipe, so one recipe's
pairs lie minutes apart; passes after the first re-measure with `rlopt compile --retime`), the bench protocol's rule
applies: a row passes when max(manifest / bench, bench / manifest) <= --max-ratio in a majority of the runs. JSON on
stdout (or --out): every row with its ratio per run and their median, the worst row, the rows outside. Exit 1 when
any row is outside.

usage: python scripts/latency_check.py [--recipe R]... [--bundled] [--coverage [NAME ...]] [--model-dir DIR]...
                                       [--work-dir DIR] [--runs 3] [--budget S] [--max-ratio 1.5] [--out FILE]
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


def compare(model_dir: Path, budget: float, max_ratio: float) -> list[dict[str, Any]]:
    """One row per (network, backend, named shape) that compile timed and the bench ran."""
    manifest = json.loads((model_dir / "manifest.json").read_text())
    bench = _rlopt("bench", str(model_dir), "--budget", str(budget), "--no-flops", cwd=model_dir.parent)
    rows = []
    for network in bench["networks"]:
        artifacts = manifest["networks"][network["network"]]["artifacts"]
        for shape in network["shapes"]:
            measured = {r["candidate"]: r["median_us"] for r in shape["results"]}
            for backend, record in artifacts.items():
                latency = (record.get("latency_us") or {}).get(shape["point"])
                bench_us = measured.get(f"rlopt {backend}")
                if latency is None or bench_us is None:
                    continue
                ratio = max(latency["p50"] / bench_us, bench_us / latency["p50"])
                rows.append({"model_dir": str(model_dir), "name": manifest["name"], "network": network["network"],
                             "backend": backend, "point": shape["point"], "shape": shape["shape"],
                             "manifest_p50_us": latency["p50"], "bench_median_us": round(bench_us, 2),
                             "ratio": round(ratio, 3), "within": ratio <= max_ratio})
    return rows


def _checked(model_dir: Path, args: argparse.Namespace, errors: list[str]) -> list[dict[str, Any]]:
    try:
        return compare(model_dir, args.budget, args.max_ratio)
    except RuntimeError as exc:
        errors.append(f"{model_dir}: {exc}")
        return []


def verdicts(runs: list[list[dict[str, Any]]], max_ratio: float) -> list[dict[str, Any]]:
    """One row per (model, network, backend, point) over the runs: the ratio in each, their median, and whether it was
    within `max_ratio` in a majority of the runs (the bench protocol's rule against this host's phases)."""
    merged: dict[tuple, dict[str, Any]] = {}
    for rows in runs:
        for row in rows:
            key = (row["name"], row["network"], row["backend"], row["point"])
            entry = merged.setdefault(key, {k: row[k] for k in ("name", "network", "backend", "point", "shape")}
                                      | {"manifest_p50_us": [], "bench_median_us": [], "ratios": []})
            entry["manifest_p50_us"].append(row["manifest_p50_us"])
            entry["bench_median_us"].append(row["bench_median_us"])
            entry["ratios"].append(row["ratio"])
    for entry in merged.values():
        ratios = entry["ratios"]
        entry["ratio"] = round(statistics.median(ratios), 3)
        entry["within_runs"] = sum(r <= max_ratio for r in ratios)
        entry["within"] = entry["within_runs"] * 2 > len(runs)
    return list(merged.values())


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", type=Path, action="append", default=[])
    parser.add_argument("--bundled", action="store_true", help="every recipe in recipes/")
    parser.add_argument("--coverage", nargs="*", default=None, metavar="NAME",
                        help="the coverage matrix's architectures (all when none is named)")
    parser.add_argument("--model-dir", type=Path, action="append", default=[])
    parser.add_argument("--work-dir", type=Path, default=None)
    parser.add_argument("--runs", type=int, default=3, help="compile-then-bench pairs per recipe (majority rule)")
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
    runs: list[list[dict[str, Any]]] = []
    for run in range(max(1, args.runs)):
        rows: list[dict[str, Any]] = []
        for model_dir in args.model_dir:
            rows.extend(_checked(model_dir.resolve(), args, errors))
        for recipe in recipes:  # benched right after its compile, so the pair shares the host's phase when it can
            try:
                model_dir = compile_recipe(recipe, work / f"{recipe.parent.name}-{recipe.stem}", retime=run > 0)
            except RuntimeError as exc:
                errors.append(f"run {run + 1}, {recipe}: {exc}")
                continue
            rows.extend(_checked(model_dir, args, errors))
        runs.append(rows)
    rows = verdicts(runs, args.max_ratio)
    outside = [r for r in rows if not r["within"]]
    report = {"max_ratio": args.max_ratio, "budget_s": args.budget, "runs": len(runs), "rows": rows, "errors": errors,
              "worst": max(rows, key=lambda r: r["ratio"], default=None), "outside": outside,
              "passed": not outside and not errors and bool(rows)}
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
