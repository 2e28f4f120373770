"""`rlopt warmup`: measure the cold start of a compiled network, drive it to steady state, check it under load.

What happens, in order (times are seconds since `rlopt.load` began, so "time to steady state"
includes loading and the first calls: the whole cold start a serving process sees):

1. `rlopt.load` the network (the runtime API, nothing else), timed.
2. First calls: each distinct profile shape once, single-threaded; its latency is the cold cost.
3. Probe baselines: the recorded inputs of reference.npz (sha256 checked) run single-threaded.
4. Load: N threads share the one Session (as a serving process does) and send the profile's
   weighted mix until the duration ends or Ctrl-C. Each thread first re-runs a probe, then one
   every PROBE_EVERY requests; a probe's outputs must equal the single-threaded ones within the
   network's atol, else the run fails ("policy consistency under load"). A recurrent network's
   `state` pairs (reference.npz) make each thread and request shape one simulated actor: it starts
   from a zero state and feeds each call's output state back as its next input state.
5. Steady state, per shape (`analysis.STEADY_DEFINITION`), percentiles before and after it, SLO check,
   report JSON and a latency-over-time PNG in MODEL_DIR/reports/ (`report`, atomic writes).
"""

from __future__ import annotations

import math
from contextlib import nullcontext
import threading
import time
from array import array
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.errors import UsageError
from rlopt.manifest import NetworkRecord, checked_file, read_manifest, shape_label
from rlopt.reference import Reference, random_input
from rlopt.machine import usable_core_ids, usable_cores
from rlopt.tools.warmup.analysis import LoadRecord, WarmupResult, analyse, max_abs_difference
from rlopt.warmup_profile import WarmupProfile, load_profile
from rlopt.tools.warmup.report import write_reports
from rlopt.tools.warmup.schema import Divergence, LiveShape, LiveStatus, Monitor

PROBE_EVERY = 25
LIVE_WINDOW_S = 2.0


def label_of(shapes: dict[str, list[int]]) -> str:
    """How the report names a request shape: `1x1x768`, inputs joined by '-' (rlopt.manifest.shape_label)."""
    return shape_label(shapes.values())


@dataclass
class Probe:
    """A recorded input and the outputs this backend gave for it single-threaded."""

    label: str
    feeds: dict[str, np.ndarray]
    expected: list[np.ndarray] = field(default_factory=list)


class LoadThread:
    """One load thread: its own request order, its own timing arrays (no locks on the hot path).

    With recurrent `state` (input -> output), the thread keeps its own copy of every request's inputs, state
    zeroed, and copies each call's output state into it after the timed call.
    """

    def __init__(self, index: int, session: Any, requests: list[dict[str, np.ndarray]], shares: np.ndarray,
                 probes: list[Probe], output_names: list[str], atol: float, t0: float, seed: int,
                 barrier: threading.Barrier, stop: threading.Event, state: dict[str, str] | None = None) -> None:
        self.index = index
        self._session = session
        self._state = list((state or {}).items())
        self._requests = [actor_inputs(r, state or {}) for r in requests] if self._state else requests
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
                feeds = self._requests[shape_id]
                start = clock()
                outputs = self._session.run(feeds)
                end = clock()
                self.starts.append(start - t0)
                self.latencies.append(end - start)
                self.shape_ids.append(shape_id)
                n += 1
                for state_input, state_output in self._state:
                    np.copyto(feeds[state_input], outputs[state_output], casting="same_kind")
        except Exception as exc:  # noqa: BLE001 -- a backend failing under load is a finding to report, whatever its type
            text = str(exc).strip().splitlines()
            self.error = f"thread {self.index}: {type(exc).__name__}: {text[0] if text else ''}"
            self._stop.set()
        finally:
            self.affinity = usable_core_ids()


def actor_inputs(request: dict[str, np.ndarray], state: dict[str, str]) -> dict[str, np.ndarray]:
    """One simulated actor's inputs: its own arrays (the caller feeds state back into them), state zeroed."""
    return {name: np.zeros_like(value) if name in state else value.copy() for name, value in request.items()}


def _threads_facts(backend: str, record: NetworkRecord) -> dict[str, Any]:
    """The cores this process may use and the threads the backend computes with (`Backend.threads`)."""
    from rlopt.backends import BACKENDS, facts_of

    threads: dict[str, Any] = {"usable_cores": usable_cores()}
    if backend in BACKENDS and backend in record.artifacts:
        threads["backend_threads"] = BACKENDS[backend].threads(facts_of(backend, record.artifacts[backend].facts))
    return threads


def _probes(reference: Reference) -> list[Probe]:
    """Sample 0 of every recorded profile point (min, opt, max) of reference.npz."""
    return [Probe(f"{point} {label_of(reference.shape(point))}", reference.feeds(point, 0))
            for point in reference.points if reference.samples(point) > 0]


def _request_inputs(profile: WarmupProfile, record: NetworkRecord, seed: int
                    ) -> tuple[list[dict[str, list[int]]], list[dict[str, np.ndarray]], np.ndarray]:
    """Distinct shapes, one fixed random input per shape (latency does not depend on the values), and shares."""
    shapes = profile.distinct_shapes()
    weights = np.array([sum(r.weight for r in profile.requests if r.shapes == s) for s in shapes], dtype=np.float64)
    rng = np.random.default_rng(seed)
    # ids that index a table without a recipe `range` are drawn from its rows, as verification drew them
    inputs = [{name: random_input(rng, record.inputs[name], dims, name=name, default_range=index_range(record, name))
               for name, dims in s.items()} for s in shapes]
    return shapes, inputs, weights / weights.sum()


def index_range(record: NetworkRecord, name: str) -> tuple[int, int] | None:
    bounds = record.inputs[name].index_range
    return (bounds[0], bounds[1]) if bounds else None


def _live_shapes(workers: list[LoadThread], labels: list[str], first_ms: list[float | None], now_s: float
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


def _collect(workers: list[LoadThread]) -> LoadRecord:
    """Every thread's requests merged in start order, and what their probes found."""

    def merged(name: str, dtype: Any) -> np.ndarray:
        parts = [np.frombuffer(getattr(w, name), dtype=dtype) for w in workers]
        return np.concatenate(parts) if parts else np.empty(0, dtype=dtype)

    starts, latencies, ids = merged("starts", np.float64), merged("latencies", np.float64), merged("shape_ids", np.intc)
    order = np.argsort(starts, kind="stable")
    return LoadRecord(starts[order], latencies[order], ids[order], [d for w in workers for d in w.divergences],
                      [w.error for w in workers if w.error], sum(w.probes_run for w in workers),
                      max((w.max_abs for w in workers), default=0.0))


def run_warmup(model_dir: Path | str, profile_path: Path | str, *, duration_s: float | None = None,
               concurrency: int | None = None, backend: str = "auto", monitor: Monitor | None = None,
               seed: int = 0, write_files: bool = True, url: str | None = None) -> WarmupResult:
    """Load, first-call, drive the mix under load, analyse; write reports/warmup-<profile>.{json,png}.

    With `url` the requests go to a running server of MODEL_DIR (`rlopt serve`; `load_ms` is then the time to
    reach it) and the probes are compared with `rlopt.load`'s single-threaded outputs in this process."""
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
    reference = Reference.load(checked_file(model_dir, record.reference), list(record.inputs), record.outputs)
    probes = _probes(reference)
    shapes, inputs, shares = _request_inputs(profile, record, seed)
    labels = [label_of(s) for s in shapes]

    def notify(phase: str, elapsed: float, workers: list[LoadThread], first_ms: list[float | None], now_s: float,
               name: str) -> None:
        if monitor is None:
            return
        monitor(LiveStatus(phase, profile.network, name, elapsed, duration, threads,
                           sum(len(w.shape_ids) for w in workers), sum(w.probes_run for w in workers),
                           sum(len(w.divergences) for w in workers), _live_shapes(workers, labels, first_ms, now_s)))

    cores = usable_core_ids()
    t0 = time.perf_counter()
    if url is None:
        session = rlopt.load(model_dir, profile.network, backend)
    else:
        from rlopt.tools.warmup.remote import RemoteSession

        session = RemoteSession(url, profile.network, record)
    load_ms = (time.perf_counter() - t0) * 1e3
    workers: list[LoadThread] = []
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
        with rlopt.load(model_dir, profile.network, backend) if url else nullcontext(session) as single:
            for probe in probes:
                probe.expected = list(single.run(probe.feeds).values())

        stop = threading.Event()
        barrier = threading.Barrier(threads + 1)
        workers = [LoadThread(i, session, inputs, shares, probes, record.outputs, atol, t0, seed, barrier, stop,
                              reference.state) for i in range(threads)]
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

    report, timeline = analyse(model_dir, profile_path, profile, backend_name, shapes, labels, shares,
                               _collect(workers), [p.label for p in probes], first_calls, load_ms, duration, threads,
                               elapsed, interrupted, atol, _threads_facts(backend_name, record))
    pinned = sorted({tuple(sorted(w.affinity)) for w in workers if w.affinity and w.affinity != cores})
    if pinned:
        report.warnings.append(f"the {report.backend} runtime narrowed the CPU affinity of load threads from cores "
                               f"{sorted(cores)} to {[list(p) for p in pinned]} (TVM does so when its thread pool "
                               "is configured unless TVM_BIND_THREADS=0): the figures are for fewer cores")
    if url is not None:
        report.url = url
    result = WarmupResult(report, timeline)
    if write_files:
        result.files_error = write_reports(result, model_dir)
    return result


__all__ = ["LIVE_WINDOW_S", "PROBE_EVERY", "LoadThread", "Probe", "actor_inputs", "label_of", "run_warmup"]
