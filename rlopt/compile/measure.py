"""Verify and time one built backend through the same runners the runtime uses: the `verify <backend>` stage.

The parity gate itself is `rlopt.verify.gate_runner`, shared with `rlopt verify`; a network with recurrent
state is checked over every recorded step with the backend's own state fed back (`rlopt.parity.run_parity`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from rlopt.backends import BACKENDS, Runner, facts_of, open_runner, unavailable_reason
from rlopt.backends.onnxruntime.facts import SECOND_SESSION_MAX_BYTES, OnnxRuntimeFacts
from rlopt.backends.tvm.runner import bucket_files
from rlopt.compile.stage import Context, Stage, StageOutput, package_digest
from rlopt.errors import BackendUnavailable, describe_exception, first_line
from rlopt.machine import OtherLoad, usable_cores
from rlopt.manifest import BackendRecord, Latency, NetworkRecord, file_record, sha256_file, shape_label
from rlopt.parity import Tolerance
from rlopt.reference import Reference
from rlopt.compile.rounds import (ROUNDS, Cells, Subjects, fresh_process_medians, interleaved_medians,
                                  open_subject, subject_cells)
from rlopt.runtime import ranked_backends, unbucketed_p50
from rlopt.runtime.routes import NOISE, OTHER, Table, choose_route
from rlopt.timing import LatencyStats, measure
from rlopt.verify import gate_runner

CPU_BACKENDS = ("torchscript", "onnxruntime", "tvm")
VARIANT_SAMPLES = 4
TIMING_BUDGET_S = 0.1  # per point, for the manifest's p50/p99 and `auto`'s pruning; `auto` times its choice itself
Infer = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


def time_points(infer: Callable[[dict[str, np.ndarray]], object], reference: Reference, points: list[str],
                **options: Any) -> dict[str, LatencyStats]:
    """Latency of `infer` on each point's first recorded sample (`options` go to rlopt.timing.measure)."""
    return {point: measure(lambda feeds=reference.feeds(point, 0): infer(feeds), **options) for point in points}


def _time_variant(base: BackendRecord, variant: str, infer: Callable[[dict[str, np.ndarray]], object],
                  reference: Reference) -> None:
    """A variant's latency at opt, for `auto` to rank the path that serves shapes without their own build."""
    at_opt = time_points(infer, reference, [p for p in reference.points if p == "opt"], budget_s=0.05,
                         min_iters=5, max_iters=200, warmup=1)
    if at_opt:
        base.facts.setdefault("variant_latency_us", {})[variant] = {"opt": round(at_opt["opt"].p50_us, 2)}


class VerifyBackend(Stage):
    """Parity and latency of one built backend; reused from the cache when artifact, reference and gate are unchanged."""

    name, inputs, cached, machine_dependent = "verify", ("reference.npz",), True, True
    # the gate and the timing (the runner's package is in `config`): a changed one re-runs, not a cached verdict
    helpers = ("rlopt.verify", "rlopt.parity", "rlopt.timing", "rlopt.reference", "rlopt.facts", "rlopt.runtime.routes",
               "rlopt.backends", "rlopt.backends.base")

    def __init__(self, backend: str, output: StageOutput, tol: Tolerance) -> None:
        self.backend, self.output, self.tol = backend, output, tol

    @property
    def label(self) -> str:
        return f"verify {self.backend}"

    def config(self, ctx: Context) -> Any:
        assert self.output.artifact is not None
        files = [self.output.artifact, *(ctx.staging / f["path"] for f in bucket_files(self.output.facts))]
        identity = ctx.keys["module"] if self.backend == "torchscript" else [sha256_file(f) for f in files]
        return {"artifact": identity, "facts": self.output.facts, "reference": sha256_file(ctx.artifacts["reference.npz"]),
                "tolerance": self.tol.__dict__, "kind": ctx.spec.kind, "distribution": ctx.spec.distribution,
                "runner_code": package_digest(BACKENDS[self.backend].runner.split(":")[0])}

    def upstream(self, ctx: Context) -> dict[str, Any]:
        return {}

    def run(self, ctx: Context) -> StageOutput:
        record, failure = self.measure(ctx)
        return StageOutput(None, {"record": record.model_dump(mode="json"), "failure": failure})

    def detail(self, ctx: Context, out: StageOutput) -> str:
        record = BackendRecord.model_validate(out.facts["record"])
        if record.parity is None:
            return out.facts["failure"] or record.facts.get("not_verified", "")
        latency = ", ".join(f"{p} p50 {v.p50:.0f}us" for p, v in record.latency_us.items())
        return ("ok" if record.parity.passed else "FAILED") + f" max_abs {record.parity.max_abs:.2e}" + \
            (f"; {latency}" if latency else "")

    def measure(self, ctx: Context) -> tuple[BackendRecord, str | None]:
        backend, output, tol, spec, reference = self.backend, self.output, self.tol, ctx.spec, ctx.reference
        assert output.artifact is not None
        facts = dict(output.facts)
        if spec.precision != "fp32" and backend in CPU_BACKENDS and "precision_built" not in facts:
            facts["notice"] = f"precision {spec.precision} not applied: {backend} runs fp32 on this CPU"
        record = file_record(ctx.staging, output.artifact)
        base = BackendRecord(path=record.path, sha256=record.sha256, bytes=record.bytes, facts=facts)
        try:
            runner = open_runner(backend, output.artifact, list(spec.inputs), facts)
        except BackendUnavailable as exc:
            base.facts.update({"verified": False, "not_verified": str(exc)})
            return base, None
        except Exception as exc:  # the library refused the artifact it just built: a failed verification, named
            base.facts["verify_error"] = f"opening it raised {describe_exception(exc)}"
            return base, f"{ctx.name}/{backend}: {record.path}: {base.facts['verify_error']}"
        try:
            gate = gate_runner(runner, reference, spec.kind, spec.distribution, tol, variant_samples=VARIANT_SAMPLES,
                               facts=base.facts)
            base.parity = gate.parity
            if gate.variant_parity:
                base.facts.setdefault("variant_parity", {}).update(gate.variant_parity)
            if gate.error is not None:
                base.facts["verify_error"] = gate.error
            failure = gate.failure(f"{ctx.name}/{backend}")
            if failure is not None:
                return base, failure
            if gate.serving is not None and gate.serving_infer is not None:
                _time_variant(base, gate.serving, gate.serving_infer, reference)
            base.latency_us = {
                point: Latency(shape=reference.shape(point), p50=round(stats.p50_us, 2), p99=round(stats.p99_us, 2),
                               iterations=stats.iterations)
                for point, stats in time_points(runner.infer, reference, reference.points, budget_s=TIMING_BUDGET_S).items()}
        finally:
            runner.close()
        return base, None


def backend_record(ctx: Context, out: StageOutput, artifact: Any) -> tuple[BackendRecord, str | None]:
    """The record a `verify <backend>` stage produced, with path / sha256 / bytes of the file here."""
    record = BackendRecord.model_validate(out.facts["record"])
    current = file_record(ctx.staging, artifact)
    record.path, record.sha256, record.bytes = current.path, current.sha256, current.bytes
    return record, out.facts["failure"]


ORT_ONE_THREAD = "onnxruntime 1 thread"  # ONNX Runtime with one intra-op thread: no pool to spin or to wake
OUTCLASSED = 2.0  # a candidate this many times slower than another at every named shape is not timed
CONTENDED = 0.25  # cores' worth of other processes' CPU (or hypervisor steal) that makes a measurement unfair
TRIES = 2  # measurements at most: a burst of other work gets one more; load through both is the machine's state
PROBE_S = 0.1  # how long the load is looked at again before a retry


def named_shapes(record: NetworkRecord, reference: Reference) -> dict[str, str]:
    """Shape label -> the first reference point with that shape, in point order."""
    labels: dict[str, str] = {}
    for point in reference.points:
        shape = reference.shape(point)
        labels.setdefault(shape_label(shape[n] for n in record.inputs), point)
    return labels


def has_other_shapes(record: NetworkRecord, named: int) -> bool:
    """Whether the profile's [min, max] holds shapes beyond the `named` ones."""
    count = math.prod(hi - lo + 1 for p in record.inputs.values() for lo, hi in zip(p.min, p.max))
    return count > named


def measure_configurations(ctx: Context, record: NetworkRecord, candidates: list[str], labels: dict[str, str],
                           estimates_us: Table | None = None,
                           one_thread_ort: bool = False) -> tuple[Table, Table, int]:
    """`alone[b]` (b's pools as when alone: ONNX Runtime spinning) and `together[b]` (every candidate open in this
    process, ONNX Runtime not spinning, cells interleaved; empty with one candidate): median us per shape label; and
    the rounds done (the fewer of the two measurements). With `one_thread_ort`, ONNX Runtime with one intra-op
    thread is timed too, as ORT_ONE_THREAD.

    ONNX Runtime alone is timed in a fresh process that opens nothing else, as a session routed to it alone runs
    it: a spinning pool timed in this process shared the cores with the idle pools of the other candidates and of
    the other sessions (the default policy at 8x16x768 on znver2: the pool at 1173 us in compile against 486-696
    us in processes of its own, which sent `auto` to one thread at 1.2-1.4x ONNX Runtime's best)."""
    subjects: Subjects = {b: (b, dict(record.artifacts[b].facts)) for b in candidates}
    if one_thread_ort and "onnxruntime" in candidates:
        subjects[ORT_ONE_THREAD] = ("onnxruntime", {**record.artifacts["onnxruntime"].facts, "intra_op_threads": 1})
    fresh = {k: v for k, v in subjects.items() if v[0] == "onnxruntime"}
    here = {k: v for k, v in subjects.items() if k not in fresh}
    alone_fresh, rounds_fresh = fresh_process_medians(ctx.staging, record, fresh, labels, estimates_us) \
        if fresh else ({}, ROUNDS)
    if len(candidates) == 1 and not here:  # ONNX Runtime's threads are the only question: nothing to mix
        return alone_fresh, {}, rounds_fresh
    opened: list[Runner] = []
    try:
        together: dict[str, Runner] = {}
        for key, (backend, facts) in subjects.items():
            update = {"allow_spinning": False} if backend == "onnxruntime" else {}
            opened.append(open_subject(ctx.staging, record, backend, {**facts, **update}))
            together[key] = opened[-1]
        def cells_of(k: str) -> Cells:  # a Session of its own for each configuration, as the runtime opens them
            return subject_cells(k, together[k], subjects[k][0], record, ctx.reference, labels)

        configurations: dict[str, Cells] = {f"alone {k}": cells_of(k) for k in here}
        configurations["together"] = {cell: call for k in subjects for cell, call in cells_of(k).items()}
        medians, rounds = interleaved_medians(configurations, estimates_us=estimates_us)
    finally:
        for runner in opened:
            runner.close()
    alone_us = {k: alone_fresh[k] if k in fresh else
                {label: round(medians[f"alone {k}"][k, label], 2) for label in labels} for k in subjects}
    together_us = {k: {label: round(medians["together"][k, label], 2) for label in labels} for k in subjects}
    return alone_us, together_us, min(rounds, rounds_fresh)


def _worst_ratio(slow: dict[str, float], fast: dict[str, float]) -> tuple[float, str]:
    """The largest slow / fast over the shapes both time (at least 1), and its shape."""
    ratios = {p: slow[p] / fast[p] for p in slow if p in fast and fast[p] > 0}
    worst = max(ratios, key=lambda p: ratios[p], default="")
    return max(1.0, ratios.get(worst, 1.0)), worst


OrtThreads = tuple[int | None, dict[str, int], Table, Table | None, str]


def ort_thread_choice(alone: Table, together: Table | None, per_shape: bool = True) -> OrtThreads:
    """ONNX Runtime's intra-op threads for `auto`: 1 or None (its default pool) for the session, and the shape labels
    that run on the other configuration (threads 1, or 0 for the pool), each in a session of its own; the tables
    with that configuration per shape as 'onnxruntime', for `choose_route`; and why.

    The bench judges every shape against the faster of the two, so each shape takes the faster of the two as
    measured (one thread on an exact tie). The session's own configuration is the one at OTHER (the shapes without a point of their own), else the
    one most shapes take. One configuration per network traded shapes against each other: sb3-ppo-cartpole's value
    net, level at 1x4 and 64x4 and 1.13x faster pooled at 256x4, stayed on one thread whenever the pool cost a
    little at 1x4. `per_shape=False` (a graph too large to open
    twice) keeps one configuration: the pool when one thread's worst shape is over NOISE and over NOISE worse than
    the pool's worst, else one thread."""
    if ORT_ONE_THREAD not in alone or "onnxruntime" not in alone:
        return None, {}, alone, together, ""
    one, pool = alone[ORT_ONE_THREAD], alone["onnxruntime"]
    labels = [label for label in one if label in pool and one[label] > 0 and pool[label] > 0]
    if not labels:
        return None, {}, alone, together, ""
    pooled = {label: pool[label] < one[label] for label in labels}
    if per_shape:
        default = pooled[OTHER] if OTHER in pooled else sum(pooled.values()) * 2 > len(pooled)
    else:
        one_worst, pool_worst = _worst_ratio(one, pool)[0], _worst_ratio(pool, one)[0]
        default = one_worst > 1 + NOISE and one_worst > pool_worst * (1 + NOISE)
        pooled = dict.fromkeys(labels, default)
    shape_threads = {label: 0 if p else 1 for label, p in pooled.items() if p != default and label != OTHER}

    def per_label(table: Table) -> dict[str, float]:
        return {label: table["onnxruntime" if pooled.get(label, default) else ORT_ONE_THREAD][label]
                for label in table["onnxruntime"] if label in table[ORT_ONE_THREAD]}

    ranked_alone = {**alone, "onnxruntime": per_label(alone)}
    ranked_together = {**together, "onnxruntime": per_label(together)} \
        if together and ORT_ONE_THREAD in together and "onnxruntime" in together else together
    chosen = ", ".join(f"{label} {'pool' if pooled[label] else '1 thread'} "
                       f"{max(one[label], pool[label]) / min(one[label], pool[label]):.2f}x" for label in labels)
    why = f"onnxruntime threads per shape (the other configuration's latency over the chosen one): {chosen}"
    return None if default else 1, shape_threads, ranked_alone, ranked_together, why


Measured = tuple[Table, Table, int]


def contended(cores: float | None) -> bool:
    """Whether other processes held CONTENDED cores or more (unknown load is not contention)."""
    return cores is not None and cores >= CONTENDED


def fair_measurement(measure: Callable[[], Measured],
                     watch: Callable[[], OtherLoad] = OtherLoad) -> tuple[Table, Table, int, list[float | None]]:
    """`measure`'s tables from a run that other processes left alone: while they (or the hypervisor) held
    CONTENDED cores or more, a pool of several threads stalls (ONNX Runtime's default pool at 3.4x its quiet
    latency in the 21:23 bench run's compile of atari-cnn, which sent it to one thread) and the run is done again, up
    to TRIES runs, unless the load is still there PROBE_S later. The least loaded run is kept; the load of each run
    (cores, None where the platform cannot tell), in order, least loaded last."""
    runs: list[tuple[float | None, Measured]] = []
    for attempt in range(TRIES):
        with watch() as load:
            measured = measure()
        runs.append((load.cores, measured))
        if not contended(load.cores) or attempt == TRIES - 1:
            break
        with watch() as now:  # a load that is still there is the machine's state, not a burst: no retry
            time.sleep(PROBE_S)
        if contended(now.cores):
            break
    kept = min(runs, key=lambda run: run[0] or 0.0)
    cores = [None if c is None else round(c, 3) for c, m in runs if m is not kept[1]]
    return (*kept[1], [*cores, None if kept[0] is None else round(kept[0], 3)])


def stall_floors(record: NetworkRecord, backends: list[str]) -> Table:
    """Per backend with a `stall_floor` hook: the latency per shape label its calls fall back to when its pool
    stalls (rlopt.backends.base.Backend). `backends` are runnable here, so each is in the registry."""
    floors: Table = {}
    for backend in backends:
        hook = BACKENDS[backend].stall_floor
        if hook is not None:
            floors[backend] = hook(facts_of(backend, record.artifacts[backend].facts))
    return {b: f for b, f in floors.items() if f}


def at_least(table: Table, floors: Table) -> tuple[Table, list[str]]:
    """`table` with each figure raised to its floor, and what was raised ("tvm 256x17 99.9 us")."""
    raised: list[str] = []
    out = {b: dict(row) for b, row in table.items()}
    for backend, floor in floors.items():
        for label, us in floor.items():
            if label in out.get(backend, {}) and out[backend][label] < us:
                out[backend][label] = us
                raised.append(f"{backend} {label} {us:g} us")
    return out, raised


def outclassed(recorded: Table, backend: str, named: dict[str, str]) -> bool:
    """Whether `backend` timed over OUTCLASSED times another's latency at every named shape (compile's verify
    timings): it would win no shape, so the rounds that time every candidate skip it."""
    return any(other != backend and all(
        label in recorded[other] and recorded[backend].get(label, math.inf) > OUTCLASSED * recorded[other][label]
        for label in named) for other in recorded)


class ChooseAuto(Stage):
    """`auto`'s route, from latencies measured in the configurations a session can run (`choose_route`); the
    runtime loads exactly what is recorded (`rlopt.runtime.recorded_plan`)."""

    name = "auto"

    def __init__(self, record: NetworkRecord) -> None:
        self.record = record

    def run(self, ctx: Context) -> StageOutput:
        record = self.record
        verified = ranked_backends(record)
        candidates = [b for b in verified if unavailable_reason(b, record.artifacts[b].facts) is None]
        named = named_shapes(record, ctx.reference)
        at_opt = next((label for label, p in named.items() if p == "opt"), next(iter(named)))
        labels = named | ({OTHER: named[at_opt]} if has_other_shapes(record, len(named)) else {})
        recorded = {b: {label: record.artifacts[b].latency_us[p].p50 for label, p in labels.items()
                        if label != OTHER and p in record.artifacts[b].latency_us} for b in candidates}
        for b in candidates:
            if OTHER in labels and math.isfinite(unbucketed_p50(record.artifacts[b])):
                recorded[b][OTHER] = unbucketed_p50(record.artifacts[b])
        alone: Table = recorded
        together: Table | None = None
        rounds = 0
        why = "; ".join(f"{b} cannot run here" for b in verified if b not in candidates)
        contenders = [b for b in candidates if not outclassed(recorded, b, named)]
        pruned = [b for b in candidates if b not in contenders]
        one_thread = "onnxruntime" in contenders and usable_cores() > 1 and \
            OnnxRuntimeFacts.of(record.artifacts["onnxruntime"].facts).intra_op_threads != 1
        load: list[float | None] = []
        if (len(contenders) > 1 or one_thread) and not why:
            try:
                alone, together, rounds, load = fair_measurement(
                    lambda: measure_configurations(ctx, record, contenders, labels, recorded, one_thread))
            except (BackendUnavailable, RuntimeError, OSError, ValueError) as exc:
                why = f"measuring failed: {first_line(exc)}"
        floors = stall_floors(record, contenders)  # a pool with no core to spare runs at one thread's speed
        alone, floored = at_least(alone, floors)
        together = at_least(together, floors)[0] if together else together
        ort_bytes = record.artifacts["onnxruntime"].bytes if "onnxruntime" in record.artifacts else 0
        ort_threads, shape_threads, ranked_alone, ranked_together, threads_why = ort_thread_choice(
            alone, together, per_shape=(ort_bytes or 0) <= SECOND_SESSION_MAX_BYTES)
        if load and contended(load[-1]):  # the tables stay recorded, the mix is not tried
            why, ranked_together = f"other processes held {load[-1]:.2f} cores through {len(load)} measurements", None
        choice = choose_route(ranked_alone, ranked_together, list(labels), contenders, why)
        routes = {label: choice.per_point[label] for label in named}
        fallback = choice.per_point.get(OTHER, choice.per_point[at_opt])
        uses_ort = "onnxruntime" in choice.per_point.values()
        reason = choice.reason + (f"; {threads_why}" if threads_why and uses_ort else "") + (
            f"; not timed: {', '.join(pruned)} (over {OUTCLASSED:g}x slower everywhere)" if pruned else "") + (
            f"; counted at one thread's speed (a stalled pool): {', '.join(floored)}" if floored else "")
        auto = {"mixed": choice.mixed, "reason": reason, "rounds": rounds, "other_load_cores": load,
                "stall_floor_us": floors,
                "alone_us": {b: dict(t) for b, t in alone.items()},
                "together_us": {b: dict(t) for b, t in (together or {}).items()}}
        ort: dict[str, Any] = {"auto_onnxruntime_threads": ort_threads} if ort_threads and uses_ort else {}
        ort_shapes = {label: t for label, t in shape_threads.items() if choice.per_point.get(label) == "onnxruntime"}
        if ort_shapes:
            ort["auto_onnxruntime_shape_threads"] = ort_shapes
        return StageOutput(None, {"auto_routes": routes | {OTHER: fallback}, **ort,
                                  "auto_onnxruntime_spinning": choice.onnxruntime_spinning,
                                  "auto_choice": auto, "selected": choice.per_point[at_opt]})

    def detail(self, ctx: Context, out: StageOutput) -> str:
        return str(out.facts["auto_choice"]["reason"])


__all__ = ["ORT_ONE_THREAD", "ChooseAuto", "VerifyBackend", "at_least", "backend_record", "fair_measurement",
           "measure_configurations", "named_shapes", "ort_thread_choice", "outclassed", "stall_floors", "time_points"]
