"""Do `auto`'s routes depend on the build machine's load, and what does a warm re-compile cost?

Compiles one recipe with the real CLI (`rlopt compile RECIPE --json`), each time in a fresh process and with a stage
cache of its own, in alternating conditions: `quiet` (the machine as it is) and `busy` (another process spinning
`while True: pass`, not pinned, for the whole compile: the bench's busy condition). Then, in the last quiet compile's
cache, a warm re-compile. Reports per compile its seconds and per network the route (`facts.route.routes` and
`options`), whether every compile shipped the same routes, and warm / cold. JSON on stdout (or --out). Exit 1 when
the routes differ or warm / cold is over --max-warm-ratio.

usage: python scripts/route_stability.py [RECIPE] [--pairs N] [--work-dir DIR] [--max-warm-ratio 0.25] [--out FILE]
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
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import condition_of  # noqa: E402  (the bench's quiet and busy conditions)

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = ROOT / "recipes" / "policy_value_heads.yaml"


def compile_once(recipe: Path, out: Path, cache: Path) -> dict[str, Any]:
    """One `rlopt compile` in a fresh process with `cache` as its stage cache: seconds, routes, stage outcomes."""
    env = {k: v for k, v in os.environ.items() if k != "RLOPT_ROUTE_PASSES"}
    env.update(RLOPT_CACHE=str(cache), COLUMNS="200",
               PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "rlopt", "compile", str(recipe), "-o", str(out), "--json"],
                          capture_output=True, text=True, cwd=recipe.parent, env=env, timeout=3600)
    seconds = time.perf_counter() - started
    if proc.returncode != 0:
        lines = [line for line in proc.stderr.splitlines() if line.strip()]
        raise SystemExit(f"rlopt compile exited {proc.returncode}: {lines[-1] if lines else ''}")
    manifest = json.loads((out / "manifest.json").read_text())
    routes, measured = {}, {}
    for name, network in manifest["networks"].items():
        route = network.get("facts", {}).get("route") or {}
        routes[name] = {"routes": route.get("routes"), "options": route.get("options")}
        choice = route.get("choice") or {}
        measured[name] = {k: choice.get(k) for k in ("measured_at", "passes", "stable", "other_load_cores")}
    auto_stages = [s.get("cache") for n in manifest["networks"].values() for s in n.get("stages", [])
                   if str(s.get("stage", s.get("label", ""))).startswith("auto")]
    return {"seconds": round(seconds, 2), "routes": routes, "measured": measured, "auto_cache": auto_stages}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", nargs="?", type=Path, default=DEFAULT_RECIPE)
    parser.add_argument("--pairs", type=int, default=2, help="quiet/busy compile pairs (default 2)")
    parser.add_argument("--work-dir", type=Path)
    parser.add_argument("--max-warm-ratio", type=float, default=0.25)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    recipe = args.recipe.resolve()
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="rlopt-routes-"))
    work.mkdir(parents=True, exist_ok=True)
    compiles: list[dict[str, Any]] = []
    for index in range(args.pairs):
        for name in ("quiet", "busy") if index % 2 == 0 else ("busy", "quiet"):
            tag = f"{index}-{name}"
            shutil.rmtree(work / tag, ignore_errors=True)
            with condition_of(name):
                result = compile_once(recipe, work / tag / "out", work / tag / "cache")
            compiles.append({"condition": name, "tag": tag, **result})
            print(f"[routes] {tag}: {result['seconds']} s", file=sys.stderr)
    last_quiet = [c for c in compiles if c["condition"] == "quiet"][-1]
    warm_out = work / "warm" / "out"
    shutil.rmtree(warm_out.parent, ignore_errors=True)
    warm = compile_once(recipe, warm_out, work / last_quiet["tag"] / "cache")
    reference = compiles[0]["routes"]
    same = all(c["routes"] == reference for c in compiles) and warm["routes"] == last_quiet["routes"]
    ratio = warm["seconds"] / last_quiet["seconds"]
    report = {"recipe": str(recipe), "compiles": compiles, "warm": {**warm, "of": last_quiet["tag"]},
              "same_routes": same, "warm_over_cold": round(ratio, 3), "max_warm_ratio": args.max_warm_ratio,
              "passed": same and ratio <= args.max_warm_ratio}
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    for c in compiles:
        print(f"{c['tag']:>9} {c['seconds']:>7.1f} s  " + "; ".join(f"{n}: {r['routes']}" for n, r in c["routes"].items()),
              file=sys.stderr)
    print(f"warm re-compile {warm['seconds']} s = {ratio:.2f} x cold ({last_quiet['tag']}); auto stage: "
          f"{warm['auto_cache']}; same routes everywhere: {same}", file=sys.stderr)
    return 0 if report["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
