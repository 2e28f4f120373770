"""rlopt.tools.warmup.analysis: steady state from per-window medians, on recorded-like synthetic traces.

A trace is what one shape's requests look like under load: start times (seconds since rlopt.load began)
and latencies (seconds). The rule must find a real cold start and must not be fooled by host noise.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import pytest

from rlopt.tools.warmup.analysis import MAX_WINDOWS, MIN_WINDOWS, cold_windows, steady_index, windows

BASE_S = 1e-3


def trace(duration_s: float = 120.0, rate: float = 200.0, sigma: float = 0.25, seed: int = 0
          ) -> tuple[np.ndarray, np.ndarray]:
    """Requests at `rate` per second for `duration_s`, log-normal latencies around BASE_S (a quiet, steady run)."""
    rng = np.random.default_rng(seed)
    starts = np.sort(rng.uniform(0, duration_s, int(duration_s * rate)))
    return starts, BASE_S * rng.lognormal(0.0, sigma, starts.size)


def steady_at(starts: np.ndarray, latencies: np.ndarray) -> float:
    index, _, note = steady_index(latencies, starts)
    assert index is not None, note
    return float(starts[index])


# ---------------------------------------------------------------------------------------------------- by count


def test_steady_state_found_after_a_cold_start() -> None:
    rng = np.random.default_rng(0)
    cold = np.linspace(10e-3, 2e-3, 100)
    warm = 1e-3 + rng.uniform(0, 1e-4, 900)
    index, final_p99, note = steady_index(np.concatenate([cold, warm]))
    assert index is not None and 80 <= index <= 150, index
    assert final_p99 is not None and 1e-3 <= final_p99 <= 1.1e-3 and note == ""


def test_flat_latency_is_steady_from_the_start() -> None:
    index, _, _ = steady_index(np.full(500, 1e-3))
    assert index == 0


def test_latency_still_rising_is_not_steady() -> None:
    index, final_p99, note = steady_index(np.linspace(1e-3, 5e-3, 500))
    assert index is None and final_p99 is not None and "still moving" in note


def test_too_few_requests_is_not_steady() -> None:
    index, final_p99, note = steady_index(np.full(10, 1e-3))
    assert index is None and final_p99 is None and "too few requests" in note



def test_a_busier_machine_later_is_not_a_cold_start() -> None:
    """Fast early requests followed by a slower tail (neighbours got busy) leave steady state at the start."""
    rng = np.random.default_rng(1)
    latencies = 1e-3 + rng.uniform(0, 1e-4, 1000)
    latencies[rng.choice(np.arange(800, 1000), 8, replace=False)] = 5e-3  # spikes only in the final window
    index, _, _ = steady_index(latencies)
    assert index == 0


# ---------------------------------------------------------------------------------------------------- by time


def test_a_p99_bump_at_60_s_in_a_run_steady_from_the_start_is_not_a_cold_start() -> None:
    """(a) The p99 rule said "steady at 62 s" for such a run: one noisy second is host noise."""
    starts, latencies = trace(seed=1)
    bump = (starts >= 60) & (starts < 61)
    hit = bump & (np.random.default_rng(2).random(starts.size) < 0.05)
    latencies[hit] *= 30  # 5% of that second's requests 30x slower: its p99 explodes, its median hardly moves
    assert np.percentile(latencies[bump], 99) > 10 * np.percentile(latencies[~bump], 99)
    assert steady_at(starts, latencies) < 10.0


def test_two_slow_seconds_mid_run_are_host_noise() -> None:
    """(a') Even the median doubling for two seconds at 60 s (a neighbour's burst) leaves steady state at the start."""
    starts, latencies = trace(seed=3)
    latencies[(starts >= 60) & (starts < 62)] *= 2
    assert steady_at(starts, latencies) < 10.0


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_real_cold_start_ends_where_latency_settles(seed: int) -> None:
    """(b) The first 5 s slow (10x at first, decaying): steady state when the decay is over, 4-7 s."""
    starts, latencies = trace(seed=seed)
    cold = starts < 5
    latencies[cold] *= 1 + 9 * (1 - starts[cold] / 5) ** 2
    at = steady_at(starts, latencies)
    assert 4.0 <= at <= 7.0, at
    index, final_p99, _ = steady_index(latencies, starts)
    assert index is not None and final_p99 is not None
    assert np.median(latencies[:index]) > 1.5 * np.median(latencies[index:])  # before is cold, after is not


@pytest.mark.parametrize("seed", range(5))
def test_pure_noise_with_heavy_tails_is_steady_early(seed: int) -> None:
    """(c) No cold start, heavy tails (log-normal sigma 1, 1% spikes of 50x): steady within 10 s."""
    starts, latencies = trace(duration_s=60, rate=100, sigma=1.0, seed=seed)
    rng = np.random.default_rng(100 + seed)
    latencies[rng.random(starts.size) < 0.01] *= 50
    assert steady_at(starts, latencies) < 10.0


def test_a_slow_first_second_alone_is_a_short_cold_start() -> None:
    starts, latencies = trace(seed=4)
    latencies[starts < 1] *= 5
    assert 1.0 <= steady_at(starts, latencies) < 2.0


def test_latency_rising_to_the_end_is_not_steady() -> None:
    starts, latencies = trace(seed=5)
    latencies *= 1 + starts / 30  # slower and slower: the last quarter is 25% slower than the quarter before
    index, final_p99, note = steady_index(latencies, starts)
    assert index is None and final_p99 is not None and "still moving" in note


def test_windows_are_about_a_second_and_never_nearly_empty() -> None:
    starts, latencies = trace(duration_s=30, rate=200)
    ranges = windows(latencies, starts)
    assert len(ranges) == 30 and ranges[0][0] == 0 and ranges[-1][1] == starts.size
    assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges))
    rare = np.array([0.0, 0.1, 0.2, 5.0, 10.1, 10.2, 10.3, 10.4, 10.5, 20.0] * 1)  # a shape requested rarely
    assert all(hi - lo >= 5 for lo, hi in windows(np.ones(rare.size), np.sort(rare)))
    short_starts, short = trace(duration_s=1, rate=400)  # a 1 s run: fewer than MIN_WINDOWS seconds, so by count
    assert len(windows(short, short_starts)) >= MIN_WINDOWS


def test_host_load_that_comes_and_goes_is_noise_not_a_trend() -> None:
    """Every second a new level within +-15% (another process on the host), and the last quarter 12% faster
    than the one before on average: within the run's own window-to-window noise, so steady from the start."""
    starts, latencies = trace(seed=6, sigma=0.1)
    rng = np.random.default_rng(7)
    latencies *= rng.uniform(0.85, 1.15, 121)[starts.astype(int)]
    latencies[starts >= 90] *= 0.88
    assert steady_at(starts, latencies) < 10.0


def test_a_long_run_gets_wider_windows() -> None:
    starts, latencies = trace(duration_s=1800, rate=20)
    assert MAX_WINDOWS - 2 <= len(windows(latencies, starts)) <= MAX_WINDOWS


def test_a_slow_stretch_that_the_run_matches_later_is_not_a_cold_start() -> None:
    """Window medians: a slow spell after fast windows, a slow start, and the same slow spell again mid-run."""
    early = np.ones(40)
    early[3:5] = 2.0
    assert cold_windows(early, band=1.2) == 0  # mostly fast up to the spell: host noise, not a cold start
    early[:5] = 2.0
    assert cold_windows(early, band=1.2) == 5
    early[25:30] = 2.0
    assert cold_windows(early, band=1.2) == 0  # the run is that slow again later on


# ---------------------------------------------------------------------------------------------------- recorded

TRACE = Path(__file__).resolve().parents[1] / "data" / "traces" / "warmup-default-recipe-tvm.npz"


def recorded(label: str) -> tuple[np.ndarray, np.ndarray]:
    """A shape's requests from a 120 s `rlopt warmup` of the default recipe (chatbot profile, 4 threads, TVM, 2
    cores shared with other work), thinned (every 24th batch-1 request, every 3rd 8x16x768 one): start times
    (s since load) and latencies (s). Load took 3.1 s; a host burst slowed every shape at 14-17 s and 52-57 s."""
    with np.load(TRACE) as data:
        return data[f"{label}:starts_s"].astype(np.float64), data[f"{label}:latency_us"].astype(np.float64) * 1e-6


@pytest.mark.parametrize("label", ["1x1x768", "8x16x768"])
def test_recorded_run_without_a_cold_start_is_steady_from_its_first_second(label: str) -> None:
    """The burst at 14-17 s made the previous rule say "steady at 18 s" for 8x16x768: the run is as slow again
    at 52-57 s, so it is noise."""
    starts, latencies = recorded(label)
    assert steady_at(starts, latencies) < starts[0] + 1.0


@pytest.mark.parametrize("label", ["1x1x768", "8x16x768"])
def test_recorded_run_with_a_cold_start_reports_it(label: str) -> None:
    """The same recorded noise with a cold start laid over its first 8 s (5x at first, decaying): it ends where the
    slowdown sinks into the run's own noise (batch 1's window medians vary by +-40% here)."""
    starts, latencies = recorded(label)
    since = starts - starts[0]
    cold = since < 8
    latencies[cold] *= 1 + 4 * (1 - since[cold] / 8) ** 2
    index, _, note = steady_index(latencies, starts)
    assert index is not None, note
    assert 3.0 <= since[index] <= 8.0, since[index]
    assert np.median(latencies[:index]) > 1.5 * np.median(latencies[index:])
