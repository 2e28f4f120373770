"""The stall experiment (issue 17 item 3): is a TVM worker at one-thread speed a property of the process, or of
what else runs on the cores? Benches COPIES identical `rlopt tvm` sessions (each its own worker process, as
`rlopt bench` runs them) beside ONNX Runtime at 1 and all threads, K interleaved rounds per shape, under:
- `as-is`: nothing added;
- `hog`: a busy-looping process pinned to the last usable core for the whole bench (what another user's job,
  or a hypervisor taking that vCPU, does to one core);
- `loop`: no bench machinery at all: one process per case calls `Session.run` in a plain loop (300 calls at
  each `--shape`, max by default) for TVM with a pool spanning every usable core (TVM_NUM_THREADS) with the
  busy-core fallback (the runner re-sizes a stalled pool to one thread; RLOPT_TVM_STALL_FALLBACK=1) and without
  it, TVM at one thread, rlopt's ONNX Runtime (its default pool) and `rlopt auto` (the recorded route: TVM on its calling
  thread where it is routed); `loop-hog`: the same with the busy process pinned to the last core. A TVM case
  prints how many times its pool was re-sized (`Session.events`).
Prints, per condition and shape, each candidate's median and its ratio to the fastest TVM copy, plus the
steal time /proc/stat counted meanwhile. A process-level cause shows as copies apart under `as-is`; a
core-level one as every TVM copy slowed under `hog` while ONNX Runtime (whose caller takes a stalled
worker's chunks) is not.

usage: python scripts/bench_stall.py MODEL_DIR [--network N] [--copies 4] [--rounds 40] [--condition C]...
                                     [--shape POINT]...
       (MODEL_DIR: e.g. `rlopt compile recipes/policy_value_heads.yaml -o DIR`)
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

HOG = "import os, sys; os.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True: pass"


def steal_ticks() -> int:
    with open("/proc/stat") as stat:
        fields = stat.readline().split()
    return int(fields[8]) if len(fields) > 8 else 0


def bench(model_dir: Path, network: str, copies: int, rounds: int) -> dict[str, Any]:
    from rlopt.tools.bench import CandidateSpec, run_bench

    extra = [CandidateSpec(f"rlopt tvm #{i}", "rlopt", "rlopt.load(..., backend='tvm').run", "rlopt", str(model_dir),
                           network, backend="tvm") for i in range(copies)]
    report = run_bench(model_dir, network, rounds=rounds, protocol=True, torch_compile=False, extra_candidates=extra)
    out: dict[str, Any] = {}
    for shape in report.networks[0].shapes:
        medians = {name: float(np.median(values)) for name, values in shape.round_medians_us.items()}
        out[shape.point] = medians
    return out


LOOP = """
import os, sys, time, numpy as np, rlopt
from pathlib import Path
from rlopt.manifest import read_manifest
from rlopt.tools.bench.candidates import load_reference
model_dir, network, backend, point = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
feeds = load_reference(model_dir, read_manifest(model_dir).networks[network]).feeds(point, 0)
session = rlopt.load(model_dir, network, backend)
for _ in range(20):
    session.run(feeds)
times = []
for _ in range(300):
    start = time.perf_counter_ns()
    session.run(feeds)
    times.append(time.perf_counter_ns() - start)
print(len(session.events), float(np.median(times)) / 1e3, flush=True)
os._exit(0)  # at exit TVM joins its pool threads, and a worker spin-yielding on the busy core can take minutes
"""


def loop(model_dir: Path, network: str, points: list[str]) -> dict[str, Any]:
    pool = str(len(os.sched_getaffinity(0)))  # a pool spanning every usable core, whatever the build chose
    cases = {f"rlopt tvm, TVM_NUM_THREADS={pool}, RLOPT_TVM_STALL_FALLBACK=1": (
                 "tvm", {"TVM_NUM_THREADS": pool, "RLOPT_TVM_STALL_FALLBACK": "1"}),
             f"rlopt tvm, TVM_NUM_THREADS={pool}": ("tvm", {"TVM_NUM_THREADS": pool}),
             "rlopt tvm, TVM_NUM_THREADS=1": ("tvm", {"TVM_NUM_THREADS": "1"}),
             "rlopt onnxruntime": ("onnxruntime", {}),
             "rlopt auto": ("auto", {})}
    out: dict[str, Any] = {}
    switches: dict[str, int] = {}
    for point in points:
        medians = {}
        for name, (backend, env) in cases.items():
            done = subprocess.run([sys.executable, "-c", LOOP, str(model_dir), network, backend, point],
                                  capture_output=True, text=True, check=True, env=dict(os.environ, **env))
            events, median = done.stdout.split()[-2:]
            medians[name] = float(median)
            switches[name] = switches.get(name, 0) + int(events)
        out[point] = medians
    return {**out, "switches": switches}


def run_condition(condition: str, args: argparse.Namespace) -> dict[str, Any]:
    hog = None
    if condition in ("hog", "loop-hog"):
        core = max(os.sched_getaffinity(0))
        hog = subprocess.Popen([sys.executable, "-c", HOG, str(core)])
    steal = steal_ticks()
    try:
        result = (loop(args.model_dir, args.network, args.shape or ["max"]) if condition.startswith("loop")
                  else bench(args.model_dir, args.network, args.copies, args.rounds))
    finally:
        if hog is not None:
            hog.kill()
            hog.wait()
    return {"condition": condition, "steal_ticks": steal_ticks() - steal, "shapes": result,
            "load_average": [round(v, 2) for v in os.getloadavg()]}


def render(outcome: dict[str, Any]) -> str:
    lines = [f"condition {outcome['condition']} (steal ticks meanwhile: {outcome['steal_ticks']}, load average "
             f"{outcome.get('load_average')})"]
    shapes = dict(outcome["shapes"])
    switches = shapes.pop("switches", None)
    if switches is not None:
        lines.append("  pool re-sized to 1 thread: " + "; ".join(f"{k} {v}x" for k, v in switches.items()
                                                                 if k.startswith("rlopt tvm")))
    for point, medians in shapes.items():
        fastest = min(v for k, v in medians.items() if k.startswith("rlopt tvm"))
        cells = [f"{name} {us:.1f} us ({us / fastest:.2f})" for name, us in sorted(medians.items())]
        lines.append(f"  {point}: " + "; ".join(cells))
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--network", default="policy")
    parser.add_argument("--copies", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=40)
    parser.add_argument("--condition", action="append", choices=["as-is", "hog", "loop", "loop-hog"])
    parser.add_argument("--shape", action="append", choices=["min", "opt", "max"], help="loop conditions: the points "
                        "to loop at (default max)")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    outcomes = [run_condition(c, args) for c in args.condition or ["as-is", "hog", "loop", "loop-hog"]]
    for outcome in outcomes:
        print(render(outcome))
    if args.out:
        args.out.write_text(json.dumps(outcomes, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
