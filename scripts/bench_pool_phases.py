"""Does ONNX Runtime's pool keep its speed over time on this host? One process, one network at one named shape:
every second, the median of 400 calls on the default pool and on one intra-op thread, and how well two threads
hashing independent buffers (hashlib releases the GIL) run side by side (1.00: as fast as one alone). On the
2-vCPU cloud hosts rlopt is benched on, the pool switches between its speed and slower than one thread for seconds
at a time while one thread and the side-by-side hashing keep theirs: the cores are not shared, their hand-offs
are slow. One line per second, and JSON (--out).

usage: python scripts/bench_pool_phases.py MODEL_DIR [--network actor] [--shape opt] [--seconds 120] [--out FILE]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BUFFER = bytes(4 << 20)


def _hash_seconds() -> float:
    start = time.perf_counter()
    hashlib.sha256(BUFFER).digest()
    return time.perf_counter() - start


def side_by_side() -> float:
    """One hash's time over the time two take on two threads at once (best of 3 each)."""
    alone = min(_hash_seconds() for _ in range(3))
    both = float("inf")
    for _ in range(3):
        threads = [threading.Thread(target=_hash_seconds) for _ in range(2)]
        start = time.perf_counter()
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        both = min(both, time.perf_counter() - start)
    return alone / both


def median_us(session: Any, feeds: dict[str, np.ndarray]) -> float:
    for _ in range(50):
        session.run(None, feeds)
    times = []
    for _ in range(400):
        start = time.perf_counter_ns()
        session.run(None, feeds)
        times.append(time.perf_counter_ns() - start)
    return float(np.median(times)) / 1e3


def main() -> int:
    import onnxruntime as ort

    from rlopt.manifest import read_manifest
    from rlopt.tools.bench.candidates import load_reference

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--network", default="actor")
    parser.add_argument("--shape", default="opt", choices=["min", "opt", "max"])
    parser.add_argument("--seconds", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    record = read_manifest(args.model_dir).networks[args.network]
    feeds = load_reference(args.model_dir, record).feeds(args.shape, 0)
    path = str(args.model_dir / args.network / "model.onnx")
    single = ort.SessionOptions()
    single.intra_op_num_threads = 1
    pool = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
    one = ort.InferenceSession(path, single, providers=["CPUExecutionProvider"])
    rows: list[dict[str, Any]] = []
    end = time.time() + args.seconds
    while time.time() < end:
        row = {"time": time.strftime("%H:%M:%S"), "side_by_side": round(side_by_side(), 2),
               "pool_us": round(median_us(pool, feeds), 1), "one_thread_us": round(median_us(one, feeds), 1)}
        rows.append(row)
        print(f"{row['time']}  side by side {row['side_by_side']:.2f}  pool {row['pool_us']:7.1f} us  "
              f"one thread {row['one_thread_us']:7.1f} us  one / pool {row['one_thread_us'] / row['pool_us']:.2f}",
              flush=True)
        time.sleep(1.0)
    ratios = [r["one_thread_us"] / r["pool_us"] for r in rows]
    summary = {"model_dir": str(args.model_dir), "network": args.network, "shape": args.shape, "rows": rows,
               "pool_faster_share": round(sum(r > 1.05 for r in ratios) / max(1, len(ratios)), 2)}
    print(f"pool clearly faster in {summary['pool_faster_share']:.0%} of {len(rows)} seconds", flush=True)
    if args.out:
        args.out.write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
