"""Short, fair latency measurement: warm up until the latency is steady, then time single calls until a budget or
count is reached.

A backend's first calls at a shape are not its speed: TorchScript's profiling executor profiles, then specializes
and fuses, for each new shape; ONNX Runtime and TVM start their thread pools. What `rlopt.load(...).run` delivers
in serving is the warm speed, so that is what compile records and what `auto` compares.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable

import numpy as np

STEADY_WINDOW = 5  # calls per window compared
STEADY_RATIO = 1.2  # the last window's fastest call no more than this below the window before's: warm
WARM_CAP_S = 3.0  # the most one shape is warmed, whatever its latency does
Clock = Callable[[], int]  # nanoseconds


@dataclass(frozen=True)
class LatencyStats:
    p50_us: float
    p99_us: float
    iterations: int
    warmup_calls: int = 0


def percentiles_us(samples_ns: list[int] | np.ndarray) -> tuple[float, float]:
    values = np.asarray(samples_ns, dtype=np.float64) / 1e3
    return float(np.percentile(values, 50)), float(np.percentile(values, 99))


def warm_until_steady(call: Callable[[], object], *, min_calls: int = 3, window: int = STEADY_WINDOW,
                      ratio: float = STEADY_RATIO, cap_s: float = WARM_CAP_S,
                      clock: Clock = time.perf_counter_ns) -> int:
    """Call until the fastest of the last `window` calls is no more than `ratio` faster than the fastest of the
    window before: the calls stopped getting faster. The fastest call, not the median: a busy machine adds delays
    to some calls, never speed. At least max(min_calls, 2 * window) calls, at most `cap_s` seconds of them.
    Returns the calls made."""
    durations: list[int] = []
    started = clock()
    while True:
        before = clock()
        call()
        after = clock()
        durations.append(after - before)
        if len(durations) >= max(min_calls, 2 * window):
            if min(durations[-window:]) * ratio >= min(durations[-2 * window:-window]):
                return len(durations)
        if after - started >= cap_s * 1e9:
            return len(durations)


def measure(call: Callable[[], object], *, budget_s: float = 0.5, min_iters: int = 10, max_iters: int = 300,
            warmup: int = 3, steady: bool = True, clock: Clock = time.perf_counter_ns) -> LatencyStats:
    """p50 and p99 of single calls after the warm-up (`warm_until_steady`, at least `warmup` calls; exactly
    `warmup` calls without `steady`), timed until `budget_s` has passed and at least `min_iters`, at most
    `max_iters` calls were timed."""
    if steady:
        warmed = warm_until_steady(call, min_calls=warmup, clock=clock)
    else:
        for _ in range(warmup):
            call()
        warmed = warmup
    samples: list[int] = []
    deadline = clock() + int(budget_s * 1e9)
    while len(samples) < max_iters and (len(samples) < min_iters or clock() < deadline):
        start = clock()
        call()
        samples.append(clock() - start)
    p50, p99 = percentiles_us(samples)
    return LatencyStats(p50, p99, len(samples), warmed)
