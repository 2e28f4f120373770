"""Short, fair latency measurement: warm up, then time single calls until a budget or count is reached."""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass(frozen=True)
class LatencyStats:
    p50_us: float
    p99_us: float
    iterations: int


def percentiles_us(samples_ns: list[int] | np.ndarray) -> tuple[float, float]:
    values = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def measure(call: Callable[[], object], *, budget_s: float = 0.5, min_iters: int = 10,
            max_iters: int = 300, warmup: int = 3) -> LatencyStats:
    for _ in range(warmup):
        call()
    samples: list[int] = []
    deadline = time.perf_counter() + budget_s
    while len(samples) < max_iters and (len(samples) < min_iters or time.perf_counter() < deadline):
        start = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - start)
    p50, p99 = percentiles_us(samples)
    return LatencyStats(p50, p99, len(samples))
