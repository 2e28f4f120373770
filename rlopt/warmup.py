"""`rlopt warmup`: measure the cold start of a compiled network, drive it to steady state, check it under load.

What happens, in order (times are seconds since `rlopt.load` began, so "time to steady state"
includes loading and the first calls: the whole cold start a serving process sees):

1. `rlopt.load` the network (the runtime API, nothing else), timed.
2. First calls: each distinct profile shape once, single-threaded; its latency is the cold cost.
3. Probe baselines: the recorded inputs of reference.npz (sha256 checked) run single-threaded.
4. Load: N threads share the one Session (as a serving process does) and send the profile's
   weighted mix until the duration ends or Ctrl-C. Each thread first re-runs a probe, then one
   every PROBE_EVERY requests; a probe's outputs must equal the single-threaded ones within the
   network's atol, else the run fails ("policy consistency under load").
5. Steady state, per shape (STEADY_DEFINITION), percentiles before and after it, SLO check,
   report JSON and a latency-over-time PNG in MODEL_DIR/reports/ (atomic writes).
"""

from __future__ import annotations

import math
import os
import threading
import time
from array import array
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
from pydantic import BaseModel

from rlopt.errors import UsageError, located
from rlopt.machine import machine_facts
from rlopt.manifest import NetworkRecord, checked_file, read_manifest, write_json
from rlopt.reference import Reference, random_input
from rlopt.warmup_profile import WarmupProfile, load_profile

PROBE_EVERY = 25
STEADY_TOLERANCE = 0.10
FINAL_WINDOW_SHARE = 0.20
MIN_FINAL_WINDOW = 20
STEADY_CANDIDATES = 200
LIVE_WINDOW_S = 2.0
STEADY_DEFINITION = (
    "per shape, over its requests under load in start order: the final window F is the last 20% (at least 20). "
    "Steady state is not reached if the p50 of the same-sized window before F differs from F's p50 by more than "
    "10% (latency still moving at the end: run longer). Otherwise the shape is steady from the earliest request t "
    "such that the requests from t to the end have p50 and p99 each at most 10% above F's (a cold start is "
    "slowness; a busier machine later on is not a cold start). The mix is steady when every shape is. Times are "
    "seconds since rlopt.load began."
)


# ----------------------------------------------------------------------------------------------------------------
# Report schema (what --json prints and reports/warmup-<profile>.json holds)


class LatencySummary(BaseModel):
    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float


class ShapeReport(BaseModel):
    label: str
    shapes: dict[str, list[int]]
    share: float
    count: int
    first_call_ms: float
    throughput_rps: float
    steady_reached: bool
    time_to_steady_s: float | None
    final_window_p99_ms: float | None
    before_steady: LatencySummary | None
    after_steady: LatencySummary | None
    note: str = ""


class Divergence(BaseModel):
    thread: int
    probe: str
    output: str
    max_abs: float
    at_s: float


class ConsistencyReport(BaseModel):
    passed: bool
    atol: float
    probes: list[str]
    compared: int
    max_abs_diff: float
    divergences: list[Divergence]
    request_errors: list[str]
    detail: str


class SloReport(BaseModel):
    p99_ms: float
    measured_p99_ms: float | None
    basis: str
    passed: bool


class WarmupReport(BaseModel):
    kind: str = "rlopt-warmup"
    schema_version: int = 1
    created_at: str
    model_dir: str
    profile: str
    profile_name: str
    network: str
    backend: str
    duration_s: float
    elapsed_s: float
    concurrency: int
    interrupted: bool
    load_ms: float
    time_to_steady_s: float | None
    steady_state: str
    requests: int
    throughput_rps: float
    shapes: list[ShapeReport]
    consistency: ConsistencyReport
    slo: SloReport | None
    passed: bool
    failures: list[str]
    machine: dict[str, Any]
    warnings: list[str] = []
    files: dict[str, str]


# ----------------------------------------------------------------------------------------------------------------
# Live status for the display


@dataclass
class LiveShape:
    label: str
    count: int
    first_call_ms: float | None
    p50_ms: float | None
    p99_ms: float | None


@dataclass
class LiveStatus:
    phase: str
    network: str
    backend: str
    elapsed_s: float
    duration_s: float
    concurrency: int
    requests: int
    probes: int
    divergences: int
    shapes: list[LiveShape]


Monitor = Callable[[LiveStatus], None]


# ----------------------------------------------------------------------------------------------------------------
# The run


def _affinity() -> set[int]:
    """The cores the calling thread may run on."""
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def shape_label(shapes: dict[str, list[int]]) -> str:
    dims = {name: "x".join(str(d) for d in value) for name, value in shapes.items()}
    if len(dims) == 1:
        return next(iter(dims.values()))
    return " ".join(f"{name}:{value}" for name, value in dims.items())


@dataclass
class Probe:
    """A recorded input and the outputs this backend gave for it single-threaded."""

    label: str
    feeds: dict[str, np.ndarray]
    expected: list[np.ndarray] = field(default_factory=list)


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


class _Worker:
    """One load thread: its own request order, its own timing arrays (no locks on the hot path)."""

    def __init__(self, index: int, session: Any, requests: list[dict[str, np.ndarray]], shares: np.ndarray,
                 probes: list[Probe], output_names: list[str], atol: float, t0: float, seed: int,
                 barrier: threading.Barrier, stop: threading.Event) -> None:
        self.index = index
        self._session = session
        self._requests = requests
        self._order = np.random.default_rng(seed + 1 + index).choice(len(requests), size=1 << 14, p=shares)
        self._probes = probes
        self._outputs = output_names
        self._atol = atol
        self._t0 = t0
        self._barrier = barrier
        self._stop = stop
        self.starts = array("d")
        self.latencies = array("d")
        self.shape_ids = array("i")
        self.probes_run = 0
        self.max_abs = 0.0
        self.divergences: list[Divergence] = []
        self.error: str | None = None
        self.affinity: set[int] = set()

    def probe(self) -> None:
        probe = self._probes[self.probes_run % len(self._probes)]
        got = list(self._session.run(probe.feeds).values())
        at = time.perf_counter() - self._t0
        self.probes_run += 1
        for name, out, expected in zip(self._outputs, got, probe.expected):
            diff = max_abs_difference(out, expected)
            self.max_abs = max(self.max_abs, diff)
            if not diff <= self._atol:
                self.divergences.append(Divergence(thread=self.index, probe=probe.label, output=name,
                                                   max_abs=diff, at_s=round(at, 4)))

    def run(self) -> None:
        try:
            self._barrier.wait()
        except threading.BrokenBarrierError:
            return
        order, n = self._order, 0
        clock, t0 = time.perf_counter, self._t0
        try:
            self.probe()
            while not self._stop.is_set():
                if n and n % PROBE_EVERY == 0:
                    self.probe()
                shape_id = int(order[n % len(order)])
                start = clock()
                self._session.run(self._requests[shape_id])
                end = clock()
                self.starts.append(start - t0)
                self.latencies.append(end - start)
                self.shape_ids.append(shape_id)
                n += 1
        except Exception as exc:  # a backend failing under load is a finding to report, whatever its type
            text = str(exc).strip().splitlines()
            self.error = f"thread {self.index}: {type(exc).__name__}: {text[0] if text else ''}"
            self._stop.set()
        finally:
            self.affinity = _affinity()


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


def _summary(latencies_s: np.ndarray) -> LatencySummary | None:
    if latencies_s.size == 0:
        return None
    ms = latencies_s * 1e3
    p50, p95, p99 = np.percentile(ms, [50, 95, 99])
    return LatencySummary(count=int(ms.size), p50_ms=round(float(p50), 4), p95_ms=round(float(p95), 4),
                          p99_ms=round(float(p99), 4), max_ms=round(float(ms.max()), 4))


def steady_index(latencies_s: np.ndarray) -> tuple[int | None, float | None, str]:
    """Index of the first steady request (STEADY_DEFINITION), the final window's p99 (s), and a note.

    Suffix statistics, not per-window ones: the p99 of a small window is nearly its maximum and flips with
    every scheduler hiccup; the p99 of "everything from t on" only drops once the cold requests are behind t.
    """
    n = latencies_s.size
    final_size = max(MIN_FINAL_WINDOW, int(n * FINAL_WINDOW_SHARE))
    if n < 2 * final_size:
        return None, None, f"too few requests ({n}) to tell steady state; run longer or raise this shape's weight"
    final_start = n - final_size
    final_p50, final_p99 = (float(v) for v in np.percentile(latencies_s[final_start:], [50, 99]))
    previous_p50 = float(np.percentile(latencies_s[final_start - final_size:final_start], 50))

    def near(value: float, target: float) -> bool:
        return abs(value - target) <= STEADY_TOLERANCE * target

    def not_slower(value: float, target: float) -> bool:
        return value <= (1 + STEADY_TOLERANCE) * target

    if not near(previous_p50, final_p50):
        return None, final_p99, (f"latency was still moving at the end (p50 {previous_p50 * 1e3:.3g} -> "
                                 f"{final_p50 * 1e3:.3g} ms over the last 40% of requests); run longer")
    step = max(1, final_start // STEADY_CANDIDATES)
    for index in range(0, final_start + 1, step):
        suffix_p50, suffix_p99 = np.percentile(latencies_s[index:], [50, 99])
        if not_slower(float(suffix_p50), final_p50) and not_slower(float(suffix_p99), final_p99):
            return index, final_p99, ""
    return final_start, final_p99, ""


def _threads_facts(backend: str, record: NetworkRecord) -> dict[str, Any]:
    facts = record.artifacts[backend].facts
    threads: dict[str, Any] = {"usable_cores": len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                               else os.cpu_count()}
    if backend == "onnxruntime":
        threads["backend_threads"] = facts.get("intra_op_threads") or "ONNX Runtime default (one per physical core)"
    elif backend == "tvm":
        threads["backend_threads"] = facts.get("num_threads") or os.environ.get("TVM_NUM_THREADS", "TVM default")
    elif backend == "torchscript":
        import torch

        threads["backend_threads"] = torch.get_num_threads()
    return threads


def _probes(model_dir: Path, record: NetworkRecord) -> list[Probe]:
    """Sample 0 of every recorded profile point (min, opt, max) of reference.npz, after its sha256 check."""
    reference = Reference.load(checked_file(model_dir, record.reference), list(record.inputs), record.outputs)
    return [Probe(f"{point} {shape_label(reference.shape(point))}", reference.feeds(point, 0))
            for point in reference.points if reference.samples(point) > 0]


def _request_inputs(profile: WarmupProfile, record: NetworkRecord, seed: int
                    ) -> tuple[list[dict[str, list[int]]], list[dict[str, np.ndarray]], np.ndarray]:
    """Distinct shapes, one fixed random input per shape (latency does not depend on the values), and shares."""
    shapes = profile.distinct_shapes()
    weights = np.array([sum(r.weight for r in profile.requests if r.shapes == s) for s in shapes], dtype=np.float64)
    rng = np.random.default_rng(seed)
    # random_input reads only `.dtype` of the spec it is given
    inputs = [{name: random_input(rng, record.inputs[name], dims) for name, dims in s.items()}  # type: ignore[arg-type]
              for s in shapes]
    return shapes, inputs, weights / weights.sum()


def _live_shapes(workers: list[_Worker], labels: list[str], first_ms: list[float | None], now_s: float
                 ) -> list[LiveShape]:
    """Counts so far and p50 / p99 over the last LIVE_WINDOW_S seconds, from copies of the workers' arrays.

    Copies (slices), never buffer views: a view would stop the worker thread from appending.
    """
    counts = np.zeros(len(labels), dtype=np.int64)
    recent_ids, recent_latencies = [], []
    for worker in workers:
        n = len(worker.shape_ids)  # appended last, so starts and latencies hold at least n entries
        counts += np.bincount(np.frombuffer(worker.shape_ids[:n], dtype=np.intc), minlength=len(labels))
        lo = max(0, n - 4000)
        starts = np.frombuffer(worker.starts[lo:n], dtype=np.float64)
        keep = starts >= now_s - LIVE_WINDOW_S
        recent_ids.append(np.frombuffer(worker.shape_ids[lo:n], dtype=np.intc)[keep])
        recent_latencies.append(np.frombuffer(worker.latencies[lo:n], dtype=np.float64)[keep])
    ids = np.concatenate(recent_ids) if recent_ids else np.empty(0, dtype=np.intc)
    latencies = np.concatenate(recent_latencies) * 1e3 if recent_latencies else np.empty(0)
    rows = []
    for i, label in enumerate(labels):
        values = latencies[ids == i]
        p50, p99 = (float(v) for v in np.percentile(values, [50, 99])) if values.size else (None, None)
        rows.append(LiveShape(label, int(counts[i]), first_ms[i], p50, p99))
    return rows


def _consistency(workers: list[_Worker], probes: list[Probe], atol: float) -> ConsistencyReport:
    divergences = [d for w in workers for d in w.divergences]
    errors = [w.error for w in workers if w.error]
    compared = sum(w.probes_run for w in workers)
    max_abs = max((w.max_abs for w in workers), default=0.0)
    if compared == 0:
        detail, passed = "nothing was compared: no probe ran under load", False
    elif divergences:
        detail, passed = f"{len(divergences)} of {compared} probe outputs diverged under load (atol {atol:g})", False
    elif errors:
        detail, passed = f"{len(errors)} thread(s) failed a request under load", False
    else:
        detail = f"{compared} probes under load matched single-threaded outputs (max |diff| {max_abs:.1e})"
        passed = True
    return ConsistencyReport(passed=passed, atol=atol, probes=[p.label for p in probes], compared=compared,
                             max_abs_diff=max_abs, divergences=divergences[:20], request_errors=errors,
                             detail=detail)


def run_warmup(model_dir: Path | str, profile_path: Path | str, *, duration_s: float | None = None,
               concurrency: int | None = None, backend: str = "auto", monitor: Monitor | None = None,
               seed: int = 0, write_files: bool = True) -> WarmupResult:
    """Load, first-call, drive the mix under load, analyse; write reports/warmup-<profile>.{json,png}."""
    import rlopt

    model_dir, profile_path = Path(model_dir), Path(profile_path)
    manifest = read_manifest(model_dir)
    profile = load_profile(profile_path, manifest, model_dir)
    duration = profile.duration_s if duration_s is None else duration_s
    threads = profile.concurrency if concurrency is None else concurrency
    if not (math.isfinite(duration) and duration > 0):
        raise UsageError(f"--duration {duration_s}: must be a finite number of seconds > 0; fix: e.g. --duration 30")
    if threads < 1:
        raise UsageError(f"--concurrency {concurrency}: must be >= 1; fix: e.g. --concurrency 4")
    record = manifest.networks[profile.network]
    atol = float(record.tolerance["atol"])
    probes = _probes(model_dir, record)
    shapes, inputs, shares = _request_inputs(profile, record, seed)
    labels = [shape_label(s) for s in shapes]

    def notify(phase: str, elapsed: float, workers: list[_Worker], first_ms: list[float | None], now_s: float,
               name: str) -> None:
        if monitor is None:
            return
        monitor(LiveStatus(phase, profile.network, name, elapsed, duration, threads,
                           sum(len(w.shape_ids) for w in workers), sum(w.probes_run for w in workers),
                           sum(len(w.divergences) for w in workers), _live_shapes(workers, labels, first_ms, now_s)))

    affinity = _affinity()
    t0 = time.perf_counter()
    session = rlopt.load(model_dir, profile.network, backend)
    load_ms = (time.perf_counter() - t0) * 1e3
    workers: list[_Worker] = []
    interrupted = False
    try:
        first_calls: list[tuple[float, float]] = []
        first_ms: list[float | None] = [None] * len(shapes)
        for i, feeds in enumerate(inputs):
            start = time.perf_counter()
            session.run(feeds)
            first_calls.append((start - t0, time.perf_counter() - start))
            first_ms[i] = first_calls[-1][1] * 1e3
            notify("first calls", 0.0, workers, first_ms, start - t0, session.backend)
        for probe in probes:
            probe.expected = list(session.run(probe.feeds).values())

        stop = threading.Event()
        barrier = threading.Barrier(threads + 1)
        workers = [_Worker(i, session, inputs, shares, probes, record.outputs, atol, t0, seed, barrier, stop)
                   for i in range(threads)]
        pool = [threading.Thread(target=w.run, name=f"rlopt-warmup-{i}", daemon=True) for i, w in enumerate(workers)]
        for thread in pool:
            thread.start()
        barrier.wait()
        phase_start = time.perf_counter()
        deadline = phase_start + duration
        try:
            while not stop.is_set():
                now = time.perf_counter()
                if now >= deadline:
                    break
                notify("under load", now - phase_start, workers, first_ms, now - t0, session.backend)
                stop.wait(min(0.25, deadline - now))
        except KeyboardInterrupt:
            interrupted = True
        finally:
            stop.set()
            for thread in pool:
                while thread.is_alive():
                    try:
                        thread.join()
                    except KeyboardInterrupt:
                        interrupted = True
        elapsed = time.perf_counter() - phase_start
        notify("done", elapsed, workers, first_ms, time.perf_counter() - t0, session.backend)
        backend_name = session.backend
    finally:
        session.close()

    report, timeline = _analyse(model_dir, profile_path, profile, record, backend_name, shapes, labels, shares,
                                workers, probes, first_calls, load_ms, duration, threads, elapsed, interrupted,
                                atol)
    pinned = sorted({tuple(sorted(w.affinity)) for w in workers if w.affinity and w.affinity != affinity})
    if pinned:
        report.warnings.append(f"the {report.backend} runtime narrowed the CPU affinity of load threads from cores "
                               f"{sorted(affinity)} to {[list(p) for p in pinned]} (TVM does so when its thread pool "
                               "is configured unless TVM_BIND_THREADS=0): the figures are for fewer cores")
    result = WarmupResult(report, timeline)
    if write_files:
        result.files_error = write_reports(result, model_dir)
    return result


def _analyse(model_dir: Path, profile_path: Path, profile: WarmupProfile, record: NetworkRecord, backend: str,
             shapes: list[dict[str, list[int]]], labels: list[str], shares: np.ndarray, workers: list[_Worker],
             probes: list[Probe], first_calls: list[tuple[float, float]], load_ms: float, duration: float,
             threads: int, elapsed: float, interrupted: bool, atol: float) -> tuple[WarmupReport, Timeline]:
    all_starts = np.concatenate([np.frombuffer(w.starts, dtype=np.float64) for w in workers]) if workers \
        else np.empty(0)
    all_latencies = np.concatenate([np.frombuffer(w.latencies, dtype=np.float64) for w in workers]) if workers \
        else np.empty(0)
    all_ids = np.concatenate([np.frombuffer(w.shape_ids, dtype=np.intc) for w in workers]) if workers \
        else np.empty(0, dtype=np.intc)
    order = np.argsort(all_starts, kind="stable")
    all_starts, all_latencies, all_ids = all_starts[order], all_latencies[order], all_ids[order]

    shape_reports: list[ShapeReport] = []
    per_shape_starts, per_shape_latencies = [], []
    steady_times: list[float | None] = []
    for i, (shape, label) in enumerate(zip(shapes, labels)):
        mask = all_ids == i
        starts, latencies = all_starts[mask], all_latencies[mask]
        per_shape_starts.append(starts)
        per_shape_latencies.append(latencies)
        index, final_p99, note = steady_index(latencies)
        steady_at = float(starts[index]) if index is not None else None
        steady_times.append(steady_at)
        shape_reports.append(ShapeReport(
            label=label, shapes=shape, share=round(float(shares[i]), 4), count=int(latencies.size),
            first_call_ms=round(first_calls[i][1] * 1e3, 4),
            throughput_rps=round(latencies.size / elapsed, 2) if elapsed > 0 else 0.0,
            steady_reached=index is not None, time_to_steady_s=None if steady_at is None else round(steady_at, 4),
            final_window_p99_ms=None if final_p99 is None else round(final_p99 * 1e3, 4),
            before_steady=_summary(latencies if index is None else latencies[:index]),
            after_steady=None if index is None else _summary(latencies[index:]),
            note=note,
        ))

    failures: list[str] = []
    consistency = _consistency(workers, probes, atol)
    if not consistency.passed:
        failures.append(f"consistency under load: {consistency.detail}")
        failures.extend(consistency.request_errors)
    reached = [t for t in steady_times if t is not None]
    mix_steady = max(reached) if reached and len(reached) == len(steady_times) else None
    slo_report = None
    if profile.slo is not None:
        if mix_steady is not None:
            steady_latencies, basis = all_latencies[all_starts >= mix_steady], "steady state"
        else:
            tail = max(MIN_FINAL_WINDOW, int(all_latencies.size * FINAL_WINDOW_SHARE))
            steady_latencies, basis = all_latencies[-tail:], "final window (steady state not reached)"
        measured = float(np.percentile(steady_latencies, 99)) * 1e3 if steady_latencies.size else None
        passed = measured is not None and measured <= profile.slo.p99_ms
        slo_report = SloReport(p99_ms=profile.slo.p99_ms, basis=basis, passed=passed,
                               measured_p99_ms=None if measured is None else round(measured, 4))
        if not passed:
            failures.append(f"SLO missed: p99 {measured if measured is None else round(measured, 3)} ms "
                            f"({basis}) > slo.p99_ms {profile.slo.p99_ms}")
    machine = machine_facts() | {"threads": _threads_facts(backend, record) | {"concurrency": threads},
                                 "load_average_end": [round(v, 2) for v in os.getloadavg()]
                                 if hasattr(os, "getloadavg") else None}
    report = WarmupReport(
        created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), model_dir=str(model_dir),
        profile=str(profile_path), profile_name=profile_path.stem, network=profile.network, backend=backend,
        duration_s=duration, elapsed_s=round(elapsed, 4), concurrency=threads, interrupted=interrupted,
        load_ms=round(load_ms, 3), time_to_steady_s=None if mix_steady is None else round(mix_steady, 4),
        steady_state=STEADY_DEFINITION, requests=int(all_latencies.size),
        throughput_rps=round(all_latencies.size / elapsed, 2) if elapsed > 0 else 0.0, shapes=shape_reports,
        consistency=consistency, slo=slo_report, passed=not failures, failures=failures, machine=machine, files={},
    )
    return report, Timeline(per_shape_starts, per_shape_latencies, first_calls)


# ----------------------------------------------------------------------------------------------------------------
# Files: reports/warmup-<profile>.json and .png (atomic)


def report_paths(model_dir: Path, profile_name: str) -> tuple[Path, Path]:
    folder = model_dir / "reports"
    return folder / f"warmup-{profile_name}.json", folder / f"warmup-{profile_name}.png"


def write_reports(result: WarmupResult, model_dir: Path) -> str | None:
    """Write the JSON report and the plot; returns a one-line error instead of raising, so the run is not lost."""
    json_path, png_path = report_paths(model_dir, result.report.profile_name)
    try:
        json_path.parent.mkdir(exist_ok=True)
        plot_timeline(result, png_path)
        result.report.files = {"json": str(json_path), "png": str(png_path)}
        write_json(json_path, result.report.model_dump(mode="json"))
    except OSError as exc:
        return located(json_path.parent, "", f"cannot write the warmup report ({exc.strerror or exc})",
                       "make MODEL_DIR writable, or copy it somewhere writable")
    return None


def rolling_p99(starts: np.ndarray, values: np.ndarray, bins: int = 60) -> tuple[np.ndarray, np.ndarray]:
    """p99 per time bin (bins with fewer than 5 requests are left out): the curve the eye should follow."""
    if starts.size == 0:
        return np.empty(0), np.empty(0)
    edges = np.linspace(starts[0], starts[-1] + 1e-9, bins + 1)
    index = np.digitize(starts, edges) - 1
    times, p99 = [], []
    for b in range(bins):
        chunk = values[index == b]
        if chunk.size >= 5:
            times.append(edges[b])
            p99.append(float(np.percentile(chunk, 99)))
    return np.asarray(times), np.asarray(p99)


def plot_timeline(result: WarmupResult, path: Path) -> None:
    """Latency over time per shape (log scale), first calls marked, steady state as a dashed line."""
    from rlopt.lazy import require

    matplotlib = require("matplotlib")
    matplotlib.use("Agg", force=True)
    from matplotlib.figure import Figure

    report, timeline = result.report, result.timeline
    figure = Figure(figsize=(10, 5.5), dpi=110)
    axes = figure.add_subplot()
    colors = matplotlib.colormaps["tab10"]
    rng = np.random.default_rng(0)
    for i, shape in enumerate(report.shapes):
        color = colors(i % 10)
        starts, latencies = timeline.starts[i], timeline.latencies[i] * 1e3
        if starts.size > 20000:
            keep = np.sort(rng.choice(starts.size, 20000, replace=False))
            starts, latencies = starts[keep], latencies[keep]
        axes.scatter(starts, latencies, s=3, alpha=0.35, color=color, linewidths=0,
                     label=f"{shape.label} ({shape.count} req)")
        p99_times, p99_values = rolling_p99(timeline.starts[i], timeline.latencies[i] * 1e3)
        axes.step(p99_times, p99_values, where="post", color=color, linewidth=1.4)
        first_at, first_latency = timeline.first_calls[i]
        axes.scatter([first_at], [first_latency * 1e3], s=60, marker="X", color=color, edgecolors="black",
                     linewidths=0.6, zorder=3)
        if shape.time_to_steady_s is not None:
            axes.axvline(shape.time_to_steady_s, color=color, linestyle="--", linewidth=1)
    if report.slo is not None:
        axes.axhline(report.slo.p99_ms, color="red", linewidth=1, label=f"SLO p99 {report.slo.p99_ms:g} ms")
    axes.set_yscale("log")
    axes.set_xlabel("seconds since rlopt.load began")
    axes.set_ylabel("latency (ms, log scale)")
    steady = "not reached" if report.time_to_steady_s is None else f"{report.time_to_steady_s:.2f} s"
    axes.set_title(f"{report.network} on {report.backend}, {report.concurrency} thread(s): "
                   f"X = first call, line = rolling p99, dashed = steady state ({steady})", fontsize=10)
    axes.grid(True, which="both", alpha=0.25)
    axes.legend(loc="upper right", fontsize=8, markerscale=3)
    figure.tight_layout()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    figure.savefig(tmp, format="png")
    os.replace(tmp, path)


# ----------------------------------------------------------------------------------------------------------------
# Rendering (rich, stderr live; stdout tables)


def _ms(value: float | None) -> str:
    return "-" if value is None else (f"{value:.3f}" if value < 1 else f"{value:.2f}")


class LiveDisplay:
    """A rich Live panel on stderr: elapsed / remaining, requests, current p50 / p99 per shape."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.live import Live

        self._live = Live(console=Console(stderr=True), auto_refresh=False, redirect_stdout=False,
                          redirect_stderr=False, transient=False)

    def __enter__(self) -> LiveDisplay:
        self._live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        self._live.__exit__(*exc)

    def __call__(self, status: LiveStatus) -> None:
        from rich.table import Table

        remaining = max(0.0, status.duration_s - status.elapsed_s)
        table = Table(title=f"warmup {status.network} on {status.backend} ({status.phase}): "
                            f"{status.elapsed_s:.1f} s elapsed, {remaining:.1f} s left, {status.requests} requests, "
                            f"{status.concurrency} thread(s), probes {status.probes} "
                            + ("[green]consistent[/]" if not status.divergences
                               else f"[red]{status.divergences} diverged[/]"),
                      title_justify="left")
        for column in ("shape", "requests", "first call ms", f"p50 ms (last {LIVE_WINDOW_S:g} s)",
                       f"p99 ms (last {LIVE_WINDOW_S:g} s)"):
            table.add_column(column, justify="right")
        for row in status.shapes:
            table.add_row(row.label, str(row.count), _ms(row.first_call_ms), _ms(row.p50_ms), _ms(row.p99_ms))
        self._live.update(table, refresh=True)


def report_table(report: WarmupReport) -> Any:
    """The human summary: one row per shape, cold (before steady state) vs steady; p95 is in the JSON."""
    from rich.markup import escape
    from rich.table import Table

    steady = "not reached" if report.time_to_steady_s is None else f"{report.time_to_steady_s:.2f} s"
    table = Table(title=f"warmup {report.network} on {report.backend}: {report.requests} requests in "
                        f"{report.elapsed_s:.1f} s from {report.concurrency} thread(s), load {report.load_ms:.0f} ms, "
                        f"steady state at {steady}" + (" [yellow](interrupted)[/]" if report.interrupted else ""))
    for column in ("shape", "share", "requests", "req/s", "first call ms", "cold p50 / p99 ms", "steady at s",
                   "steady p50 / p99 ms"):
        table.add_column(column, justify="right", overflow="fold")

    def pair(summary: LatencySummary | None) -> str:
        return "-" if summary is None else f"{_ms(summary.p50_ms)} / {_ms(summary.p99_ms)}"

    for shape in report.shapes:
        table.add_row(shape.label, f"{shape.share:.0%}", str(shape.count), f"{shape.throughput_rps:.0f}",
                      _ms(shape.first_call_ms), pair(shape.before_steady),
                      "-" if shape.time_to_steady_s is None else f"{shape.time_to_steady_s:.2f}",
                      pair(shape.after_steady) if shape.after_steady else f"[yellow]{escape(shape.note or '-')}[/]")
    consistency = report.consistency
    table.caption = ("consistency: " + ("[green]ok[/] " if consistency.passed else "[red]FAILED[/] ")
                     + escape(consistency.detail)
                     + ("" if report.slo is None else
                        f"; SLO p99 {report.slo.p99_ms:g} ms: measured {_ms(report.slo.measured_p99_ms)} ms "
                        f"({report.slo.basis}) " + ("[green]met[/]" if report.slo.passed else "[red]missed[/]"))
                     + "".join(f"; [yellow]WARNING[/] {escape(w)}" for w in report.warnings))
    return table


__all__ = ["run_warmup", "WarmupResult", "WarmupReport", "LiveDisplay", "report_table", "steady_index",
           "STEADY_DEFINITION"]
