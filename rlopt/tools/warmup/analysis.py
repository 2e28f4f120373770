"""Warmup statistics: steady state per shape, percentiles before and after it, consistency, the SLO, the report.

Steady state is read from per-window medians, never from a tail percentile: a window's median does not
move when the host hiccups for a few calls, a p99 does (the old p99 rule reported "steady at 62 s" for
a run steady from its first second, because of one noisy second at 60 s). A slow stretch at the start
counts as a cold start only if no stretch as long later in the run is as slow: a host burst a few
seconds in (it slows every shape at once) looks like the bursts later in the same run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from itertools import pairwise
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.machine import load_average, machine_facts
from rlopt.warmup_profile import WarmupProfile
from rlopt.tools.warmup.schema import (
    ConsistencyReport,
    Divergence,
    LatencySummary,
    ShapeReport,
    SloReport,
    WarmupReport,
)

WINDOW_S = 1.0  # time windows of about a second ...
MIN_WINDOW_REQUESTS = 20  # ... widened so that they hold this many requests on average
MERGE_BELOW = 5  # a window with fewer requests (a stall, a rare shape) joins the next one
MIN_WINDOWS = 8  # fewer time windows than this (a short run): windows by count instead
MAX_WINDOWS = 600  # a longer run gets wider windows (the cold-start test compares every stretch with every later one)
COUNT_WINDOWS = 50  # windows by count: this many, of at least MERGE_BELOW requests each
BAND_K = 3.0  # the band: steady level + BAND_K * max(spread, BAND_FLOOR * level)
BAND_FLOOR = 0.05  # so a band is never narrower than +15 % of the level, however quiet the run
DRIFT_TOLERANCE = 0.10  # last quarter's level vs the quarter before: more apart than this and 3 x the noise = moving
FINAL_WINDOW_SHARE = 0.20  # the SLO's basis when steady state is not reached: the last 20 % of requests
MIN_FINAL_WINDOW = 20
STEADY_DEFINITION = (
    "per shape, over its requests under load in start order, split into windows of ~1 s (at least 20 requests "
    "on average, at most 600 windows; by count, 50 windows, when the run is shorter than 8 windows), each "
    "summarised by its median. Steady level = median of the last half's window medians; spread = 1.4826 x their median absolute deviation; "
    "band = level + 3 x max(spread, 5% of level). Not steady if the median of the last quarter's window medians "
    "differs from the quarter before by more than 10% and by more than 3 x the window-to-window noise (1.4826 x "
    "the median absolute successive difference / sqrt 2): latency still moving at the end, beyond the run's own "
    "noise; run longer. Otherwise steady state begins where the cold start ends, at the first request if there is "
    "none. The cold start grows from the first window: each window above the band in the first half, in order, "
    "extends it to itself when the windows from its current end through that window have a median of medians above "
    "the band and higher than that of every stretch of as many consecutive windows later in the run (a slow spell "
    "that the run matches later is host noise, not a cold start; faster is never cold). The mix is steady when "
    "every shape is. Times are seconds since rlopt.load began."
)


# ----------------------------------------------------------------------------------------------------------------
# Steady state


def windows(latencies_s: np.ndarray, starts_s: np.ndarray | None = None) -> list[tuple[int, int]]:
    """[begin, end) request ranges: ~WINDOW_S time windows when `starts_s` allows MIN_WINDOWS of them, else by count."""
    n = latencies_s.size
    if n == 0:
        return []
    if starts_s is not None and starts_s.size == n:
        span = float(starts_s[-1] - starts_s[0])
        width = max(WINDOW_S, span * MIN_WINDOW_REQUESTS / n, span / MAX_WINDOWS)
        if span / width >= MIN_WINDOWS:
            bins = np.floor((starts_s - starts_s[0]) / width).astype(np.int64)
            edges = [0, *(np.flatnonzero(np.diff(bins)) + 1).tolist(), n]
            return _merged(list(pairwise(edges)))
    size = max(MERGE_BELOW, -(-n // COUNT_WINDOWS))
    return _merged([(lo, min(lo + size, n)) for lo in range(0, n, size)])


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Windows with fewer than MERGE_BELOW requests join the next one (the last such joins the one before)."""
    out: list[tuple[int, int]] = []
    begin = None
    for lo, hi in ranges:
        begin = lo if begin is None else begin
        if hi - begin >= MERGE_BELOW:
            out.append((begin, hi))
            begin = None
    if begin is not None:
        if out:
            out[-1] = (out[-1][0], ranges[-1][1])
        else:
            out.append((begin, ranges[-1][1]))
    return out


def steady_index(latencies_s: np.ndarray, starts_s: np.ndarray | None = None
                 ) -> tuple[int | None, float | None, str]:
    """Index of the first steady request (STEADY_DEFINITION), the last half's p99 (s), and a note.

    `starts_s` (request start times, ascending) gives time windows; without it, windows are by count.
    """
    ranges = windows(latencies_s, starts_s)
    if len(ranges) < MIN_WINDOWS:
        return None, None, (f"too few requests ({latencies_s.size}) to tell steady state; run longer or raise this "
                            "shape's weight")
    medians = np.array([np.median(latencies_s[lo:hi]) for lo, hi in ranges])
    m = medians.size
    last_half = medians[m // 2:]
    final_p99 = float(np.percentile(latencies_s[ranges[m // 2][0]:], 99))
    level = float(np.median(last_half))
    quarter = max(1, m // 4)
    final, previous = float(np.median(medians[m - quarter:])), float(np.median(medians[m - 2 * quarter:m - quarter]))
    # window-to-window noise, from successive differences: a slow trend does not inflate it
    noise = 1.4826 * float(np.median(np.abs(np.diff(last_half)))) / np.sqrt(2) if last_half.size > 1 else 0.0
    if abs(previous - final) > max(DRIFT_TOLERANCE * final, BAND_K * noise):
        return None, final_p99, (f"latency was still moving at the end (window median {previous * 1e3:.3g} -> "
                                 f"{final * 1e3:.3g} ms over the last half of the run); run longer")
    spread = 1.4826 * float(np.median(np.abs(last_half - level)))
    band = level + BAND_K * max(spread, BAND_FLOOR * level)
    return ranges[cold_windows(medians, band)][0], final_p99, ""


def cold_windows(medians: np.ndarray, band: float) -> int:
    """How many windows at the start are a cold start (0: none); see STEADY_DEFINITION.

    The run's own later slow spells are the yardstick: a slow stretch counts as cold only if nothing as long after it
    is as slow. Each out-of-band window of the first half, in order, extends the cold start when the windows from
    the cold start's current end through it are, by the median of their medians, above the band and slower than
    every stretch as long after them; so a host burst a few seconds after a cold start does not lengthen it.
    """
    end = 0
    for w in np.flatnonzero(medians[:medians.size // 2] > band):
        segment = medians[end:w + 1]
        level = float(np.median(segment))
        later = np.lib.stride_tricks.sliding_window_view(medians[w + 1:], segment.size)
        if level > band and level > float(np.median(later, axis=1).max()):
            end = int(w) + 1
    return end


# ----------------------------------------------------------------------------------------------------------------
# Summaries, consistency, the report


@dataclass
class Timeline:
    """Every request under load, per distinct shape, in start order (seconds since load began)."""

    starts: list[np.ndarray]
    latencies: list[np.ndarray]
    first_calls: list[tuple[float, float]]


@dataclass
class WarmupResult:
    report: WarmupReport
    timeline: Timeline
    files_error: str | None = None

    @property
    def passed(self) -> bool:
        return self.report.passed


@dataclass
class LoadRecord:
    """What the load threads measured, merged and in start order (shape_ids index the profile's distinct shapes)."""

    starts: np.ndarray
    latencies: np.ndarray
    shape_ids: np.ndarray
    divergences: list[Divergence]
    errors: list[str]
    compared: int
    max_abs: float


def summary(latencies_s: np.ndarray) -> LatencySummary | None:
    if latencies_s.size == 0:
        return None
    ms = latencies_s * 1e3
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return LatencySummary(count=int(ms.size), p50_ms=round(float(p50), 4), p95_ms=round(float(p95), 4),
                          p99_ms=round(float(p99), 4), max_ms=round(float(ms.max()), 4))


def max_abs_difference(got: np.ndarray, expected: np.ndarray) -> float:
    """Largest |got - expected|; NaN where both are NaN counts as equal, a shape change as infinite."""
    if got.shape != expected.shape:
        return float("inf")
    if got.size == 0:
        return 0.0
    a = got.astype(np.float64)
    b = expected.astype(np.float64)
    diff = np.abs(a - b)
    diff[np.isnan(a) & np.isnan(b)] = 0.0
    diff[np.isnan(diff)] = np.inf
    return float(diff.max())


def consistency(load: LoadRecord, probe_labels: list[str], atol: float) -> ConsistencyReport:
    compared, divergences, errors = load.compared, load.divergences, load.errors
    if compared == 0:
        detail, passed = "nothing was compared: no probe ran under load", False
    elif divergences:
        detail, passed = f"{len(divergences)} of {compared} probe outputs diverged under load (atol {atol:g})", False
    elif errors:
        detail, passed = f"{len(errors)} thread(s) failed a request under load", False
    else:
        detail = f"{compared} probes under load matched single-threaded outputs (max |diff| {load.max_abs:.1e})"
        passed = True
    return ConsistencyReport(passed=passed, atol=atol, probes=probe_labels, compared=compared,
                             max_abs_diff=load.max_abs, divergences=divergences[:20], request_errors=errors,
                             detail=detail)


def shape_reports(load: LoadRecord, shapes: Sequence[dict[str, list[int]]], labels: Sequence[str],
                  shares: np.ndarray, first_calls: Sequence[tuple[float, float]], elapsed: float
                  ) -> tuple[list[ShapeReport], Timeline, list[float | None]]:
    """Per shape: its steady state, its percentiles before and after it; the timeline; the steady times."""
    reports: list[ShapeReport] = []
    per_shape_starts, per_shape_latencies = [], []
    steady_times: list[float | None] = []
    for i, (shape, label) in enumerate(zip(shapes, labels)):
        mask = load.shape_ids == i
        starts, latencies = load.starts[mask], load.latencies[mask]
        per_shape_starts.append(starts)
        per_shape_latencies.append(latencies)
        index, final_p99, note = steady_index(latencies, starts)
        steady_at = float(starts[index]) if index is not None else None
        steady_times.append(steady_at)
        reports.append(ShapeReport(
            label=label, shapes=shape, share=round(float(shares[i]), 4), count=int(latencies.size),
            first_call_ms=round(first_calls[i][1] * 1e3, 4),
            throughput_rps=round(latencies.size / elapsed, 2) if elapsed > 0 else 0.0,
            steady_reached=index is not None, time_to_steady_s=None if steady_at is None else round(steady_at, 4),
            final_window_p99_ms=None if final_p99 is None else round(final_p99 * 1e3, 4),
            before_steady=summary(latencies if index is None else latencies[:index]),
            after_steady=None if index is None else summary(latencies[index:]),
            note=note,
        ))
    return reports, Timeline(per_shape_starts, per_shape_latencies, list(first_calls)), steady_times


def slo_report(profile: WarmupProfile, load: LoadRecord, mix_steady: float | None) -> SloReport | None:
    if profile.slo is None:
        return None
    if mix_steady is not None:
        steady_latencies, basis = load.latencies[load.starts >= mix_steady], "steady state"
    else:
        tail = max(MIN_FINAL_WINDOW, int(load.latencies.size * FINAL_WINDOW_SHARE))
        steady_latencies, basis = load.latencies[-tail:], "final window (steady state not reached)"
    measured = float(np.percentile(steady_latencies, 99)) * 1e3 if steady_latencies.size else None
    passed = measured is not None and measured <= profile.slo.p99_ms
    return SloReport(p99_ms=profile.slo.p99_ms, basis=basis, passed=passed,
                     measured_p99_ms=None if measured is None else round(measured, 4))


def analyse(model_dir: Path, profile_path: Path, profile: WarmupProfile, backend: str,
            shapes: Sequence[dict[str, list[int]]], labels: Sequence[str], shares: np.ndarray, load: LoadRecord,
            probe_labels: list[str], first_calls: Sequence[tuple[float, float]], load_ms: float, duration: float,
            threads: int, elapsed: float, interrupted: bool, atol: float, threads_facts: dict[str, Any]
            ) -> tuple[WarmupReport, Timeline]:
    """The report: per shape, the consistency check, the SLO, the machine; and the timeline for the plot."""
    shape_rows, timeline, steady_times = shape_reports(load, shapes, labels, shares, first_calls, elapsed)
    failures: list[str] = []
    checked = consistency(load, probe_labels, atol)
    if not checked.passed:
        failures.append(f"consistency under load: {checked.detail}")
        failures.extend(checked.request_errors)
    reached = [t for t in steady_times if t is not None]
    mix_steady = max(reached) if reached and len(reached) == len(steady_times) else None
    slo = slo_report(profile, load, mix_steady)
    if slo is not None and not slo.passed:
        measured = slo.measured_p99_ms
        failures.append(f"SLO missed: p99 {measured if measured is None else round(measured, 3)} ms "
                        f"({slo.basis}) > slo.p99_ms {slo.p99_ms}")
    machine = machine_facts() | {"threads": threads_facts | {"concurrency": threads},
                                 "load_average_end": load_average()}
    requests = int(load.latencies.size)
    report = WarmupReport(
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), model_dir=str(model_dir),
        profile=str(profile_path), profile_name=profile_path.stem, network=profile.network, backend=backend,
        duration_s=duration, elapsed_s=round(elapsed, 4), concurrency=threads, interrupted=interrupted,
        load_ms=round(load_ms, 3), time_to_steady_s=None if mix_steady is None else round(mix_steady, 4),
        steady_state=STEADY_DEFINITION, requests=requests,
        throughput_rps=round(requests / elapsed, 2) if elapsed > 0 else 0.0, shapes=shape_rows,
        consistency=checked, slo=slo, passed=not failures, failures=failures, machine=machine, files={},
    )
    return report, timeline


__all__ = ["STEADY_DEFINITION", "LoadRecord", "Timeline", "WarmupResult", "analyse", "consistency",
           "cold_windows", "max_abs_difference", "steady_index", "summary", "windows"]
