"""The TVM busy-core fallback's rule, on latencies recorded on this machine (docs/benchmarks.md, the stall)."""

from __future__ import annotations

import os
import threading
from typing import Any

from rlopt.backends.tvm.stall import (STREAK, WINDOW, StallGuard, one_thread_pool, size_thread_pool,
                                      thread_pool_size, timed, watch_limit_us)

# the default policy, compiled here: TVM at 1 and 2 threads per shape (facts.thread_latency_us)
POLICY = {"1x1x768": {"1": 27.93, "2": 22.13}, "8x16x768": {"1": 933.01, "2": 484.58}}
VALUE_MIN = {"1": 25.4, "2": 35.83}


def feed(guard: StallGuard, latencies_us: list[float]) -> None:
    for us in latencies_us:
        guard.observe(int(us * 1e3))


def test_only_shapes_where_the_pool_clearly_won_are_watched_at_one_threads_latency() -> None:
    assert watch_limit_us(POLICY["8x16x768"], 2) == 933.01
    assert watch_limit_us(POLICY["1x1x768"], 2) == 27.93, "1.26x faster with the pool"
    assert watch_limit_us(VALUE_MIN, 2) is None, "the pool lost here: its calls may exceed one thread's"
    assert watch_limit_us({"1": 100.0, "2": 90.0}, 2) is None, "a 1.1x win is not a clear one"
    assert watch_limit_us(POLICY["8x16x768"], 1) is None and watch_limit_us({}, 2) is None


def test_a_stalled_pool_trips_once_and_a_healthy_one_with_intrusions_never() -> None:
    trips: list[StallGuard] = []
    healthy = StallGuard(933.01, trips.append)
    # 2-thread calls near compile's 485 us, a fifth of them hit by an intrusion (one-thread speed or worse)
    feed(healthy, [480.0, 520.0, 495.0, 1150.0, 505.0] * 8 * WINDOW)
    # and a burst of stalled calls lasting STREAK - 1 windows, between healthy ones
    feed(healthy, [4000.0] * (STREAK - 1) * WINDOW + [490.0] * WINDOW + [4000.0] * (STREAK - 1) * WINDOW)
    assert trips == []
    stalled = StallGuard(933.01, trips.append)
    feed(stalled, [4000.0, 4400.0, 4600.0, 6700.0, 500.0, 500.0, 6000.0, 4500.0] * (STREAK * WINDOW // 8))
    assert trips == [stalled], "STREAK windows of mostly stalled calls (the four stalled copies' medians)"
    feed(stalled, [4000.0] * 3 * STREAK * WINDOW)
    assert trips == [stalled], "a guard reports once"
    half = StallGuard(933.01, trips.append)
    feed(half, [950.0, 480.0] * (STREAK * WINDOW))
    assert len(trips) == 1, "exactly half of each window slow is not most of it"
    most = StallGuard(933.01, trips.append)
    feed(most, ([950.0] * (WINDOW // 2 + 1) + [480.0] * (WINDOW // 2 - 1)) * STREAK)
    assert trips[-1] is most, "most calls at one-thread speed or worse, window after window: the pool is a loss"


def test_timed_reports_each_calls_duration_and_passes_the_result_through() -> None:
    seen: list[int] = []

    class Recorder(StallGuard):
        def observe(self, elapsed_ns: int) -> None:
            seen.append(elapsed_ns)

    call = timed(lambda arrays: [a * 2 for a in arrays], Recorder(1.0, lambda g: None))
    assert call([1, 2]) == [2, 4] and call([3]) == [6]
    assert len(seen) == 2 and all(ns > 0 for ns in seen)


def test_the_pool_is_resized_once_per_thread_without_binding_the_caller() -> None:
    calls: list[tuple[Any, ...]] = []
    before = os.environ.get("TVM_BIND_THREADS")

    def configure(mode: int, threads: int, cpus: list[str]) -> None:
        calls.append((mode, threads, cpus, os.environ.get("TVM_BIND_THREADS")))

    results: list[bool] = []
    worker = threading.Thread(target=lambda: results.extend([one_thread_pool(configure), one_thread_pool(configure)]))
    worker.start()
    worker.join()
    assert results == [True, False] and calls == [(1, 1, ["0"], "0")]
    assert os.environ.get("TVM_BIND_THREADS") == before


def test_a_pool_sized_to_one_thread_runs_the_calling_threads_parallel_loops_inline() -> None:
    """Real TVM: `one_thread` facts say so, and `size_thread_pool(1)` in a thread starts no worker there."""
    import pytest

    pytest.importorskip("tvm")
    from rlopt.backends import BACKENDS

    facts = BACKENDS["tvm"].one_thread({"num_threads": 2})
    assert facts.num_threads == 1 and facts.calling_thread_only
    assert BACKENDS["tvm"].route_update({"num_threads": 2}) == {"num_threads": 1, "calling_thread_only": True}
    assert BACKENDS["tvm"].route_update({"num_threads": 1, "tuned": True}) == \
        {"num_threads": 1, "calling_thread_only": True}, "the same route whatever thread count the build measured"
    assert BACKENDS["tvm"].threads(facts) == 1
    seen: list[Any] = []

    def work() -> None:
        before, unsized = len(os.listdir("/proc/self/task")), thread_pool_size()
        size_thread_pool(1)
        seen.extend([unsized, thread_pool_size(), len(os.listdir("/proc/self/task")) - before])

    worker = threading.Thread(target=work)
    worker.start()
    worker.join()
    assert seen == [None, 1, 0], "per thread: a new thread's pool was not sized by rlopt before"
