"""The benchmark protocol's arithmetic (scripts/bench.py): paired per-round ratios, the A/A noise, the spread over
runs and the per-row verdict. Pure functions over `rlopt bench` reports' per-round block medians.

Per shape, in one run: the peers' best is the fastest (median over rounds) of ONNX Runtime's 1- and all-thread
sessions and any peer backend benched (`Backend.bench_peer`, candidates.PEER_PREFIX); a ratio X / Y is the
median over rounds of X's block median / Y's block median in the same round, so drift that hits a whole round
cancels; the A/A ratio is that of the best session's twin (the same session in another process) to the session
itself, and its noise is max(A/A, 1 / A/A).
Over R runs, a row passes when auto / the peers' best <= TOLERANCE x that run's A/A noise in at least
ceil(2R/3) runs and never exceeds CEILING.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from rlopt.tools.bench.candidates import AA_SUFFIX, PEER_PREFIX

AUTO = "rlopt auto"
EAGER = "pytorch eager"
SB3 = "sb3 predict"
TOLERANCE = 1.05  # auto / ORT best may exceed the run's A/A noise by this factor
CEILING = 1.2  # ... and never this ratio
SPREAD_LIMIT = 0.15  # the default policy's max shape: max / min of its per-run ratios - 1


def paired_ratio(numerator: Sequence[float], denominator: Sequence[float]) -> float:
    """Median over rounds of numerator[i] / denominator[i] (both per-round block medians of one run)."""
    rounds = min(len(numerator), len(denominator))
    if rounds == 0:
        raise ValueError("no common rounds to pair")
    return float(np.median(np.asarray(numerator[:rounds], float) / np.asarray(denominator[:rounds], float)))


def ort_sessions(rounds: Mapping[str, Sequence[float]]) -> list[str]:
    """The plain ONNX Runtime sessions (1 thread, all threads), not their twins nor rlopt's own backend."""
    return [name for name in rounds if name.startswith("onnxruntime ") and not name.endswith(AA_SUFFIX)]


def peer_sessions(rounds: Mapping[str, Sequence[float]]) -> list[str]:
    """ONNX Runtime's plain sessions and the peer backends benched, not their twins."""
    return ort_sessions(rounds) + [name for name in rounds if name.startswith(PEER_PREFIX) and
                                   not name.endswith(AA_SUFFIX)]


def _fastest(rounds: Mapping[str, Sequence[float]], names: list[str]) -> str | None:
    sessions = [name for name in names if len(rounds[name])]
    return min(sessions, key=lambda name: float(np.median(rounds[name]))) if sessions else None


def ort_best(rounds: Mapping[str, Sequence[float]]) -> str | None:
    """The ONNX Runtime session with the lowest median over rounds."""
    return _fastest(rounds, ort_sessions(rounds))


def peer_best(rounds: Mapping[str, Sequence[float]]) -> str | None:
    """The peer session (`peer_sessions`) with the lowest median over rounds."""
    return _fastest(rounds, peer_sessions(rounds))


def aa_noise(aa_ratio: float) -> float:
    """How far apart two copies of one candidate ran, whichever was slower: >= 1."""
    return max(aa_ratio, 1.0 / aa_ratio)


@dataclass(frozen=True)
class ShapeRatios:
    """One shape in one run: every ratio is to the peers' best, paired by round; None where absent."""

    peer_best: str
    peer_best_us: float
    auto: float | None
    aa: float | None
    eager: float | None
    sb3: float | None

    def to_json(self) -> dict[str, float | str | None]:
        return {"peer_best": self.peer_best, "peer_best_us": self.peer_best_us, "auto": self.auto, "aa": self.aa,
                "eager": self.eager, "sb3": self.sb3}


def shape_ratios(rounds: Mapping[str, Sequence[float]]) -> ShapeRatios | None:
    """The protocol's ratios at one shape from its per-round medians; None without a peer session."""
    best = peer_best(rounds)
    if best is None:
        return None

    def to_best(name: str) -> float | None:
        return round(paired_ratio(rounds[name], rounds[best]), 4) if len(rounds.get(name, ())) else None

    return ShapeRatios(best, round(float(np.median(rounds[best])), 3), to_best(AUTO), to_best(best + AA_SUFFIX),
                       to_best(EAGER), to_best(SB3))


def spread(values: Sequence[float]) -> tuple[float, float, float]:
    """(min, max, max / min - 1) of per-run values."""
    low, high = min(values), max(values)
    return low, high, high / low - 1.0


@dataclass(frozen=True)
class Verdict:
    """Done-when check of one row over its runs (see the module docstring)."""

    runs: int
    within: int  # runs where auto <= TOLERANCE x that run's A/A noise
    needed: int
    worst: float
    passed: bool
    reason: str

    def to_json(self) -> dict[str, object]:
        return {"runs": self.runs, "within": self.within, "needed": self.needed, "worst": self.worst,
                "passed": self.passed, "reason": self.reason}


def verdict(auto: Sequence[float], aa: Sequence[float | None]) -> Verdict:
    """auto[i], aa[i]: run i's auto / ORT best and A/A ratio. A run without an A/A ratio is noise 1."""
    if not auto or len(auto) != len(aa):
        raise ValueError("one auto and one A/A ratio per run")
    needed = math.ceil(2 * len(auto) / 3)
    within = sum(a <= TOLERANCE * (aa_noise(n) if n else 1.0) for a, n in zip(auto, aa, strict=True))
    worst = max(auto)
    problems = []
    if within < needed:
        problems.append(f"within {TOLERANCE:g}x A/A in {within} of {len(auto)} runs, needs {needed}")
    if worst > CEILING:
        problems.append(f"worst run {worst:.2f} > {CEILING:g}")
    return Verdict(len(auto), within, needed, worst, not problems, "; ".join(problems) or "ok")


__all__ = [
    "AUTO",
    "CEILING",
    "EAGER",
    "SB3",
    "SPREAD_LIMIT",
    "TOLERANCE",
    "ShapeRatios",
    "Verdict",
    "aa_noise",
    "ort_best",
    "ort_sessions",
    "peer_best",
    "peer_sessions",
    "paired_ratio",
    "shape_ratios",
    "spread",
    "verdict",
]
