"""Issue 33 item 1's experiment: can a TVM pool keep its win without stalling on a busy core, if its caller takes
the chunks a late worker has not started? Runs a MODEL_DIR's `rlopt tvm` session in four modes, each in a process
of its own, interleaved over R rounds, per named shape and condition:
- `one`: one thread (what `auto` routes TVM as today);
- `pool`: TVM's own pool of 2 threads (TVM_NUM_THREADS=2): the caller waits for each worker's static share;
- `steal N`: TVM's parallel launch replaced (scripts/steal_launcher.c, compiled here with cc) by a caller plus one
  helper taking N chunks from one counter: the caller never waits on a chunk nobody started.
Conditions: `quiet` (as the machine is), `busy` (a `while True: pass` process, not pinned), `pinned` (the same,
pinned to the last usable core). Each process warms, then times up to 30 blocks of about 50 ms (at least 3,
at most 3 s); its figure is the median block mean. Prints a table and writes JSON (--out).

usage: python scripts/bench_steal.py MODEL_DIR [--network policy] [--rounds 3] [--shape min]... [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench import SPIN  # noqa: E402 -- the bench's busy condition (scripts/ is on sys.path when run)
from bench_stall import HOG  # noqa: E402 -- bench_stall's spinner pinned to one core

ROOT = Path(__file__).resolve().parents[1]
MODES = {"one": ("1", 0), "pool": ("2", 0), "steal 2": ("1", 2), "steal 4": ("1", 4)}
CONDITIONS = {"quiet": None, "busy": [SPIN], "pinned": [HOG, str(max(os.sched_getaffinity(0)))]}  # spinner's -c args

CASE = r"""
import ctypes, os, re, subprocess, sys, time
from pathlib import Path
import numpy as np
import rlopt
from rlopt.manifest import read_manifest
from rlopt.tools.bench.candidates import load_reference
model_dir, network, point, chunks, launcher = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4]), sys.argv[5]
feeds = load_reference(model_dir, read_manifest(model_dir).networks[network]).feeds(point, 0)
session = rlopt.load(model_dir, network, backend="tvm")
expected = session.run(feeds)
if chunks:  # each loaded kernel library's context pointer __TVMBackendParallelLaunch, set to the launcher
    lib = ctypes.CDLL(launcher)
    lib.rlopt_steal_config(chunks, 300000)
    address = ctypes.cast(lib.rlopt_parallel_launch, ctypes.c_void_p).value
    patched = 0
    for line in open("/proc/self/maps"):
        fields = line.split()
        if len(fields) >= 6 and "tvm-llvm" in fields[5] and int(fields[2], 16) == 0:
            symbols = subprocess.run(["nm", "-D", str(model_dir / network / Path(fields[5]).name)],
                                     capture_output=True, text=True).stdout
            if "TVMBackendParallelBarrier" in symbols:
                sys.exit("a kernel library uses TVMBackendParallelBarrier: the launcher cannot run it")
            found = re.search(r"^([0-9a-f]+) \S __TVMBackendParallelLaunch$", symbols, re.M)
            if found:
                ctypes.c_void_p.from_address(int(fields[0].split("-")[0], 16) + int(found.group(1), 16)).value = address
                patched += 1
    assert patched, "no kernel library was patched"
for _ in range(100):
    out = session.run(feeds)
for name in expected:
    np.testing.assert_allclose(out[name], expected[name], rtol=1e-5, atol=1e-5)
start = time.perf_counter()
session.run(feeds)
calls = max(1, min(300, int(0.05 / max(time.perf_counter() - start, 1e-7))))  # blocks of ~50 ms: a stall is slow
blocks, end = [], time.perf_counter() + 3.0
while len(blocks) < 30 and (len(blocks) < 3 or time.perf_counter() < end):
    start = time.perf_counter_ns()
    for _ in range(calls):
        session.run(feeds)
    blocks.append((time.perf_counter_ns() - start) / calls / 1e3)
print(float(np.median(blocks)), flush=True)
os._exit(0)  # at exit TVM joins its pool threads; one spin-yielding on a busy core can take minutes
"""


def build_launcher(work: Path) -> Path:
    out = work / "libsteal.so"
    subprocess.run(["cc", "-O2", "-shared", "-fPIC", "-o", str(out), str(ROOT / "scripts" / "steal_launcher.c"),
                    "-lpthread"], check=True)
    return out


def one_case(model_dir: Path, network: str, point: str, mode: str, launcher: Path) -> float:
    threads, chunks = MODES[mode]
    env = dict(os.environ, TVM_NUM_THREADS=threads, PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", CASE, str(model_dir), network, point, str(chunks), str(launcher)],
                          capture_output=True, text=True, env=env, timeout=600)
    if done.returncode != 0:
        raise RuntimeError(f"{mode} at {point}: {(done.stderr.strip().splitlines() or [''])[-1]}")
    return float(done.stdout.split()[-1])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--network", default="policy")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--shape", action="append", choices=["min", "opt", "max"])
    parser.add_argument("--condition", action="append", choices=list(CONDITIONS))
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    points = args.shape or ["min", "opt", "max"]
    results: dict[str, Any] = {"model_dir": str(args.model_dir), "network": args.network, "rounds": args.rounds,
                               "conditions": {}}
    with tempfile.TemporaryDirectory(prefix="rlopt-steal-") as work:
        launcher = build_launcher(Path(work))
        for condition in args.condition or list(CONDITIONS):
            spinning = CONDITIONS[condition]
            spinner = None if spinning is None else subprocess.Popen([sys.executable, "-c", *spinning])
            try:
                samples: dict[str, dict[str, list[float]]] = {p: {m: [] for m in MODES} for p in points}
                for _ in range(args.rounds):
                    for point in points:
                        for mode in MODES:
                            samples[point][mode].append(one_case(args.model_dir, args.network, point, mode, launcher))
            finally:
                if spinner is not None:
                    spinner.kill()
                    spinner.wait()
            table = {p: {m: round(statistics.median(v), 2) for m, v in modes.items()} for p, modes in samples.items()}
            results["conditions"][condition] = table
            for point, medians in table.items():
                print(f"{condition:7} {point:4} " + "  ".join(f"{m} {us:8.1f} us ({us / medians['one']:.2f})"
                                                               for m, us in medians.items()), flush=True)
            if args.out:
                args.out.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
