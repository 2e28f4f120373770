"""Timing both MODEL_DIRs' selected routes now, with the bench protocol (rlopt.tools.bench).

Per network, four worker processes (fresh interpreters, `rlopt.load(..., backend="auto")`, feeds from each
MODEL_DIR's own reference.npz): OLD_DIR, a twin of it, NEW_DIR, a twin of it. Per named shape they run interleaved
rounds (`time_interleaved`: one block per copy per round, the order shuffled each round, the copies not being
timed frozen) for `budget_s`. The per-round block medians go to `compare.latency_figures`; this module is the only
one that reads a clock, so tests give the comparison timings of their own (a `Timer`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Protocol

from rlopt.tools.bench.analysis import round_medians_us
from rlopt.tools.bench.candidates import CandidateSpec
from rlopt.tools.bench.driver import CandidateFailed, Worker, stop_all, time_interleaved
from rlopt.tools.bench.worker import BLOCK_CALLS
from rlopt.tools.diff.compare import NEW, NEW_TWIN, OLD, OLD_TWIN, NetworkTiming

METHOD = ("per network, four worker processes (OLD_DIR and NEW_DIR, each as rlopt.load(..., backend='auto') twice: "
          "a copy and its A/A twin), the bench protocol's interleaved rounds per named shape (a block of "
          f"{BLOCK_CALLS} calls per copy per round, the first untimed, order shuffled, the others frozen); a side's "
          "figure per round is the lower block median of its two copies; ratio = median over rounds of new / old; "
          "a shape regresses when the ratio exceeds max_latency_ratio and the A/A noise "
          "(max(A/A, 1 / A/A) of either side)")


class Timer(Protocol):
    def __call__(self, old_dir: Path, new_dir: Path, network: str, points: Sequence[str], budget_s: float,
                 seed: Sequence[int], progress: Callable[[str], None]) -> NetworkTiming:
        """Per-round block medians (us) of the four copies at each point; failures by copy."""


def time_network(old_dir: Path, new_dir: Path, network: str, points: Sequence[str], budget_s: float,
                 seed: Sequence[int], progress: Callable[[str], None]) -> NetworkTiming:
    """The bench protocol over the four copies (see the module docstring)."""
    copies = [(OLD, old_dir), (OLD_TWIN, old_dir), (NEW, new_dir), (NEW_TWIN, new_dir)]
    specs = [CandidateSpec(name, "rlopt", f"rlopt.load({folder}, backend='auto').run", "rlopt", str(folder), network,
                           backend="auto") for name, folder in copies]
    timing = NetworkTiming()
    progress(f"{network}: opening OLD_DIR and NEW_DIR twice each, one process each")
    workers: list[Worker] = []
    try:
        for spec in specs:  # all start at once: they import and open in parallel
            workers.append(Worker(spec))
        live = []
        for worker in workers:
            try:
                worker.opened()
                live.append(worker)
            except CandidateFailed as exc:
                timing.failures[worker.spec.name] = str(exc)
                worker.stop()
        for index, point in enumerate(points):
            if not live:
                break
            progress(f"{network}: {point}: {len(live)} copies, ~{budget_s:g} s")
            for worker in live:
                worker.at(point, False)
            samples, _, failures = time_interleaved({w.spec.name: w for w in live}, budget_s, seed=[*seed, index])
            for worker in [w for w in live if w.spec.name in failures]:
                timing.failures[worker.spec.name] = f"failed at {point}: {failures[worker.spec.name]}"
                worker.stop()
            live = [w for w in live if w.spec.name not in failures]
            timing.rounds[point] = round_medians_us(samples, BLOCK_CALLS - 1)
    finally:
        stop_all(workers)
    return timing


__all__ = ["METHOD", "Timer", "time_network"]
