"""Bench statistics: per shape, each candidate's median / p99 / mean and its ratio to the best ONNX Runtime."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np

from rlopt.reference import Reference
from rlopt.tools.bench.schema import CandidateResult, NetworkBench


def profile_points(reference: Reference) -> list[str]:
    """The recorded profile points (min, opt, max, extra shapes) that hold at least one sample."""
    return [p for p in reference.points if reference.samples(p) > 0]


def shape_results(samples: dict[str, np.ndarray], first_ms: dict[str, float], candidates: Sequence[tuple[str, str]],
                  gflop: float | None, yardsticks: Collection[str] = ()) -> tuple[list[CandidateResult], str | None]:
    """One row per candidate (name, group) with samples (ns per call), fastest first, and the best of `yardsticks`
    (the ONNX Runtime candidates: `candidates.is_yardstick`) that every ratio divides by."""
    medians = {n: float(np.median(s)) / 1e3 for n, s in samples.items() if s.size}
    ort = {n: m for n, m in medians.items() if n in yardsticks}
    ort_best = min(ort, key=ort.__getitem__) if ort else None
    results = []
    for name, group in candidates:
        s = samples.get(name)
        if s is None or not s.size:
            continue
        us = s / 1e3
        median = medians[name]
        results.append(CandidateResult(
            candidate=name, group=group, median_us=round(median, 2),
            p99_us=round(float(np.percentile(us, 99)), 2), mean_us=round(float(us.mean()), 2), calls=int(s.size),
            ratio_to_ort_best=round(median / ort[ort_best], 3) if ort_best else None,
            gflops_per_s=round(gflop / (median * 1e-6), 2) if gflop else None,
            first_call_ms=round(first_ms[name], 3)))
    results.sort(key=lambda r: r.median_us)
    return results, ort_best


def round_medians_us(samples: dict[str, np.ndarray], timed_per_block: int) -> dict[str, list[float]]:
    """Each candidate's per-round block median in us: the samples are its blocks in round order, `timed_per_block` each."""
    rounds = rounds_of(samples, timed_per_block)
    return {name: [round(float(v) / 1e3, 3) for v in
                   np.median(s[:rounds * timed_per_block].reshape(rounds, timed_per_block), axis=1)]
            for name, s in samples.items()} if rounds else {}


def rounds_of(samples: dict[str, np.ndarray], timed_per_block: int) -> int:
    """Complete interleaved rounds: the fewest blocks any surviving candidate ran."""
    return min(s.size for s in samples.values()) // timed_per_block if samples else 0


def affinity_warnings(networks: Sequence[NetworkBench], affinity: set[int]) -> list[str]:
    """A worker whose CPU affinity a runtime narrowed ran on fewer cores than the others: say so."""
    return [f"{net.network} / {name}: its process's CPU affinity was cores {info.cores} after warmup, not "
            f"{sorted(affinity)}: a runtime pinned it (TVM does so when its thread pool is configured unless "
            "TVM_BIND_THREADS=0), so it ran on fewer cores"
            for net in networks for name, info in net.workers.items() if info.cores and set(info.cores) != affinity]


def torch_threads(networks: Sequence[NetworkBench]) -> int | None:
    """The threads torch computed with, from the eager or TorchScript worker (None when neither ran)."""
    return next((info.threads for net in networks for name, info in net.workers.items()
                 if name in ("pytorch eager", "torchscript module")), None)


__all__ = ["affinity_warnings", "profile_points", "round_medians_us", "rounds_of", "shape_results", "torch_threads"]
