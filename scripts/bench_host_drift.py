"""How far does this host's speed move over seconds, against how far two processes read apart at the same moment?
One backend's artifact of one network at one named shape, opened in --processes worker processes (the latency
stage's workers: each frozen except while it times), timed in interleaved rounds for one second at a time. Per
second: each process's median, their spread (max / min: the A/A at one moment) and the seconds' range (slowest /
fastest second: what two measurements taken seconds apart can differ by). One line per second, and JSON (--out).

usage: python scripts/bench_host_drift.py MODEL_DIR [--network net] [--backend onnxruntime] [--shape min]
                                          [--processes 4] [--seconds 30] [--out FILE]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def main() -> int:
    from rlopt.compile import apart
    from rlopt.manifest import read_manifest

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("model_dir", type=Path)
    parser.add_argument("--network", default=None, help="default: the manifest's first network")
    parser.add_argument("--backend", default="onnxruntime")
    parser.add_argument("--shape", default="min", help="a named shape: min, opt or max")
    parser.add_argument("--processes", type=int, default=4)
    parser.add_argument("--seconds", type=int, default=30)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    manifest = read_manifest(args.model_dir)
    network = args.network or next(iter(manifest.networks))
    record = manifest.networks[network]
    facts = record.artifacts[args.backend].facts.as_dict()
    subjects = {f"process {i}": (args.backend, facts) for i in range(max(2, args.processes))}
    seconds = []
    with apart.kept_workers():
        for second in range(args.seconds):
            rounds = apart.apart_rounds(args.model_dir, record, subjects, {args.shape: args.shape}, budget_s=1.0,
                                        rounds=100_000, keep=True)
            medians = {k: v[args.shape] for k, v in rounds.medians().items()}
            spread = max(medians.values()) / min(medians.values())
            seconds.append({"second": second, "rounds": rounds.done, "median_us": medians,
                            "aa_spread": round(spread, 3)})
            print(f"{second:3d}  {statistics.median(medians.values()):8.1f} us  A/A spread {spread:.3f}",
                  file=sys.stderr)
    typical = [statistics.median(s["median_us"].values()) for s in seconds]
    report = {"model_dir": str(args.model_dir), "network": network, "backend": args.backend, "shape": args.shape,
              "processes": len(subjects), "seconds": seconds,
              "aa_spread_median": round(statistics.median(s["aa_spread"] for s in seconds), 3),
              "aa_spread_max": max(s["aa_spread"] for s in seconds),
              "fastest_second_us": round(min(typical), 2), "slowest_second_us": round(max(typical), 2),
              "range": round(max(typical) / min(typical), 3)}
    text = json.dumps(report, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
