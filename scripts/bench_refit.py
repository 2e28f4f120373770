"""Refit against recompiling: cold `rlopt compile --json` vs `rlopt refit --json` seconds, each in its own
process, plus the in-process `rlopt.refit` and `Session.reload` medians.

`measure_refit(recipe, work_dir, runs)` is what scripts/bench.py calls; standalone it prints the JSON.
Only backends with a refit hook are compiled (the registry says which), so the two sides build the same
artifacts. The new weights are the recipe's model with every floating-point entry moved by 1% noise.

usage: python scripts/bench_refit.py [--runs 3] [--work-dir DIR] [RECIPE]
"""

from __future__ import annotations

import argparse
import json
import os
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
    from rlopt.stages.load_model import build_model

    model, _ = build_model(load_recipe(recipe).model, recipe)
    generator = torch.Generator().manual_seed(seed)
    state = {k: v + 0.01 * v.abs().mean() * torch.randn(v.shape, generator=generator) if v.is_floating_point() else v
             for k, v in model.state_dict().items()}
    torch.save(state, path)
    return path


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


def measure_refit(recipe: Path | str, work_dir: Path | str, runs: int = 3) -> dict[str, Any]:
    """Per run: a cold compile (empty cache) and a refit of it, each `rlopt ... --json` in its own process;
    then in this process, after one warm-up call, `runs` timed `rlopt.refit` and `Session.reload` calls."""
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
    return {"recipe": recipe.name, "backends": backends, "runs": runs,
            "compile_cold_seconds": compile_s, "refit_cli_seconds": refit_s,
            "compile_cold_median_s": _median(compile_s), "refit_cli_median_s": _median(refit_s),
            "refit_over_compile": round(statistics.median(refit_s) / statistics.median(compile_s), 3),
            "refit_in_process_median_s": _median(in_process), "reload_median_ms": reload_ms,
            "load_average": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("recipe", nargs="?", type=Path, default=DEFAULT_RECIPE)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--work-dir", type=Path, default=None)
    args = parser.parse_args()
    if args.work_dir is not None:
        result = measure_refit(args.recipe, args.work_dir, args.runs)
    else:
        with tempfile.TemporaryDirectory(prefix="rlopt-bench-refit-") as folder:
            result = measure_refit(args.recipe, Path(folder), args.runs)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
