"""Latency as a warm backend delivers it: warm-up until steady, then timed calls; on a fake clock, no wall clock."""

from __future__ import annotations

from rlopt.timing import STEADY_WINDOW, WARM_CAP_S, measure, warm_until_steady


class Backend:
    """A call whose n-th run costs costs_us[n] (the last one from then on), on a clock only the calls advance."""

    def __init__(self, *costs_us: float) -> None:
        self.costs_us, self.ns, self.calls = list(costs_us), 0, 0

    def clock(self) -> int:
        return self.ns

    def __call__(self) -> None:
        self.ns += int(self.costs_us[min(self.calls, len(self.costs_us) - 1)] * 1e3)
        self.calls += 1


def jit(slow_us: list[float], warm_us: float) -> Backend:
    """A JIT's first calls at a shape (profiling, specializing, fusing), then its speed."""
    return Backend(*slow_us, warm_us)


def test_the_first_calls_of_a_jit_are_not_its_speed() -> None:
    """TorchScript at a new shape: seconds, then tenths, then its speed; the old 3-call warm-up with a 0.1 s budget
    timed ten calls, most of them still specializing."""
    specializing = [900_000, 500_000, 240_000, 230_000, 140_000, 60_000, 30_000, 10_000]
    backend = jit(specializing, 150)
    stats = measure(backend, budget_s=0.1, clock=backend.clock)
    assert stats.p50_us == 150 and stats.p99_us == 150
    assert stats.warmup_calls >= len(specializing) + STEADY_WINDOW
    old = jit(specializing, 150)
    assert measure(old, budget_s=0.1, steady=False, clock=old.clock).p50_us > 1000, "what the old warm-up recorded"


def test_a_late_respecialization_is_waited_for() -> None:
    """Fast calls, then one re-specialization (as TorchScript's profiling executor does a few calls into a shape),
    then faster still: the warm-up goes on until the fastest calls of two windows agree."""
    backend = Backend(300, 280, 260, 250, 24_000, 250, 200, 150, 150, 150, 150, 150, 150, 150, 150, 150, 150, 150)
    calls = warm_until_steady(backend, clock=backend.clock)
    assert calls >= 2 * STEADY_WINDOW and measure(backend, clock=backend.clock).p50_us == 150


def test_a_steady_backend_is_warmed_briefly_even_when_noisy_and_a_never_steady_one_is_capped() -> None:
    steady = Backend(100)
    assert warm_until_steady(steady, clock=steady.clock) == 2 * STEADY_WINDOW
    at_least = Backend(100)
    assert warm_until_steady(at_least, min_calls=25, clock=at_least.clock) == 25
    noisy = Backend(*[v for _ in range(1000) for v in (100, 4_000, 12_000)])  # a busy machine's delays
    assert warm_until_steady(noisy, clock=noisy.clock) == 2 * STEADY_WINDOW, "delays are not a warm-up"
    improving = Backend(*[1_000_000 / 1.1 ** n for n in range(1000)])  # 1.6x faster every window, for good
    warm_until_steady(improving, clock=improving.clock)
    assert WARM_CAP_S * 1e9 <= improving.ns < WARM_CAP_S * 1e9 + 1e9


def test_measure_times_until_the_budget_within_its_call_bounds() -> None:
    backend = Backend(1000)
    stats = measure(backend, budget_s=0.05, min_iters=10, max_iters=300, clock=backend.clock)
    assert stats.iterations == 50 and stats.p50_us == 1000  # 50 ms of 1 ms calls
    slow = Backend(100_000)
    assert measure(slow, budget_s=0.05, min_iters=10, clock=slow.clock).iterations == 10
    quick = Backend(1)
    assert measure(quick, budget_s=10, max_iters=300, clock=quick.clock).iterations == 300
