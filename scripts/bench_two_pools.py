"""Why `auto` never routes two pools in one process: ONNX Runtime's pool at one shape and OpenVINO's at another,
as a route holding both would run them, against each backend alone at both shapes. Each mode in a process of its
own, interleaved over R rounds, per condition; each process warms, then alternates the two shapes (`calls`: one
call each in turn, as a batcher mixing shapes does; `blocks`: 30 calls of one shape, then 30 of the other) and
reports the median latency per shape. Modes:
- `onnxruntime`, `openvino`: that backend alone at both shapes (its pool, as routed alone);
- `two pools`: ONNX Runtime (spinning, as when it holds a route) at the small shape, OpenVINO at the large one;
- `two pools, ORT asleep`: the same with ONNX Runtime's pool sleeping between calls (`spinning=False`);
- `two pools, blocks`: the spinning pair, 30 calls of a shape at a time.
Conditions: `quiet`, `busy` (a `while True: pass` process beside, not pinned).

usage: python scripts/bench_two_pools.py MODEL_DIR [--network actor] [--small opt] [--large max] [--rounds 3]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench import condition_of  # noqa: E402 -- the bench's quiet and busy conditions (scripts/ is on sys.path)

ROOT = Path(__file__).resolve().parents[1]
MODES = {  # small shape's backend, large shape's, ONNX Runtime spinning, calls per turn
    "onnxruntime": ("onnxruntime", "onnxruntime", True, 1), "openvino": ("openvino", "openvino", True, 1),
    "two pools": ("onnxruntime", "openvino", True, 1), "two pools, ORT asleep": ("onnxruntime", "openvino", False, 1),
    "two pools, blocks": ("onnxruntime", "openvino", True, 30)}
CONDITIONS = ["quiet", "busy"]

CASE = r"""
import json, os, sys, time
from pathlib import Path
import numpy as np
import rlopt
from rlopt.manifest import read_manifest
from rlopt.tools.bench.candidates import load_reference
model_dir, network, small, large, first, second, spinning, block = (Path(sys.argv[1]), sys.argv[2], sys.argv[3],
    sys.argv[4], sys.argv[5], sys.argv[6], sys.argv[7] == "1", int(sys.argv[8]))
reference = load_reference(model_dir, read_manifest(model_dir).networks[network])
feeds = {small: reference.feeds(small, 0), large: reference.feeds(large, 0)}
opened = {name: rlopt.load(model_dir, network, backend=name, spinning=spinning if name == "onnxruntime" else True)
          for name in {first, second}}
calls = {small: opened[first], large: opened[second]}
times = {small: [], large: []}
for _ in range(100):
    for point, session in calls.items():
        session.run(feeds[point])
for _ in range(1800 // block):
    for point, session in calls.items():
        for _ in range(block):
            start = time.perf_counter_ns()
            session.run(feeds[point])
            times[point].append((time.perf_counter_ns() - start) / 1e3)
print(json.dumps({point: float(np.median(values)) for point, values in times.items()}), flush=True)
os._exit(0)
"""


def one_case(model_dir: Path, network: str, small: str, large: str, mode: str) -> dict[str, float]:
    first, second, spinning, block = MODES[mode]
    done = subprocess.run([sys.executable, "-c", CASE, str(model_dir), network, small, large, first, second,
                           "1" if spinning else "0", str(block)], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    if done.returncode != 0:
        raise RuntimeError(f"{mode}: {(done.stderr.strip().splitlines() or [''])[-1]}")
    return json.loads(done.stdout.splitlines()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--network", default="actor")
    parser.add_argument("--small", default="opt", choices=["min", "opt", "max"])
    parser.add_argument("--large", default="max", choices=["min", "opt", "max"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--condition", action="append", choices=CONDITIONS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results: dict[str, Any] = {"model_dir": str(args.model_dir), "network": args.network, "rounds": args.rounds,
                               "small": args.small, "large": args.large, "conditions": {}}
    for condition in args.condition or CONDITIONS:
        samples: dict[str, dict[str, list[float]]] = {m: {args.small: [], args.large: []} for m in MODES}
        with condition_of(condition):
            for _ in range(args.rounds):
                for mode in MODES:
                    for point, us in one_case(args.model_dir, args.network, args.small, args.large, mode).items():
                        samples[mode][point].append(us)
        table = {m: {p: round(statistics.median(v), 1) for p, v in points.items()} for m, points in samples.items()}
        results["conditions"][condition] = table
        for mode, medians in table.items():
            print(f"{condition:5} {mode:22} " + "  ".join(f"{p} {us:8.1f} us" for p, us in medians.items()), flush=True)
        if args.out:
            args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
