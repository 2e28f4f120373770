"""`auto`'s route: which verified backend serves which shape, chosen from latencies measured in the configurations
a session can run, and how each backend of the route opens (the `auto` stage).

Every candidate is timed alone (a backend declared `timed_apart` in a worker process of its own) and all together,
each as a mixed route opens it (`Backend.mixed_options`); a backend with configurations of its own (`Backend.auto`:
ONNX Runtime's threads) has each timed and picks one per shape. The choice rule is `rlopt.runtime.routes.choose_route`;
the result is the network's `RoutePlan`, which the runtime loads as recorded (`rlopt.runtime.recorded_plan`).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

from rlopt.backends import BACKENDS, Runner, facts_of, unavailable_reason
from rlopt.backends.capability import TunedRoute
from rlopt.compile.rounds import (ROUNDS, Cells, Subjects, fresh_process_medians, interleaved_medians,
                                  open_subject, subject_cells)
from rlopt.errors import BackendUnavailable, first_line
from rlopt.facts import AutoChoiceFacts, RoutePlan
from rlopt.machine import OtherLoad, usable_cores
from rlopt.manifest import NetworkRecord, shape_label
from rlopt.reference import Reference
from rlopt.runtime import ranked_backends, unbucketed_p50
from rlopt.runtime.routes import OTHER, Table, choose_route
from rlopt.stages.base import Context, Stage, StageOutput

OUTCLASSED = 2.0  # a candidate this many times slower than another at every named shape is not timed
CONTENDED = 0.25  # cores' worth of other processes' CPU (or hypervisor steal) that makes a measurement unfair
TRIES = 2  # measurements at most: a burst of other work gets one more; load through both is the machine's state
PROBE_S = 0.1  # how long the load is looked at again before a retry
Variants = dict[str, dict[str, dict[str, Any]]]  # backend -> configuration name -> facts update


def subject_key(backend: str, configuration: str = "") -> str:
    """How the tables name a backend's configuration: '<backend> <configuration>' ('<backend>' for its own)."""
    return f"{backend} {configuration}" if configuration else backend


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
                           variants: Variants | None = None) -> tuple[Table, Table, int]:
    """`alone[k]` (each subject's pools as when alone) and `together[k]` (every subject open in this process, each
    as a mixed route opens it, cells interleaved; empty with one candidate and no other configuration timed here):
    median us per shape label; and the rounds done (the fewer of the two measurements). Subjects are the candidates
    and each of their `variants` (keyed `subject_key`).

    A backend `timed_apart` is timed alone in a fresh process that opens nothing else, as a session routed to it
    alone runs it: ONNX Runtime's spinning pool timed in this process shared the cores with the idle pools of the
    other candidates and sessions (the default policy at 8x16x768 on znver2: 1173 us here against 486-696 us in
    processes of its own)."""
    subjects: Subjects = {}
    for backend in candidates:
        facts = record.artifacts[backend].facts.as_dict()
        subjects[backend] = (backend, facts)
        for name, update in (variants or {}).get(backend, {}).items():
            subjects[subject_key(backend, name)] = (backend, {**facts, **update})
    fresh = {k: v for k, v in subjects.items() if BACKENDS[v[0]].timed_apart}
    here = {k: v for k, v in subjects.items() if k not in fresh}
    alone_fresh, rounds_fresh = fresh_process_medians(ctx.staging, record, fresh, labels, estimates_us) \
        if fresh else ({}, ROUNDS)
    if len(candidates) == 1 and not here:  # one backend's configurations are the only question: nothing to mix
        return alone_fresh, {}, rounds_fresh
    opened: list[Runner] = []
    try:
        together: dict[str, Runner] = {}
        for key, (backend, facts) in subjects.items():
            opened.append(open_subject(ctx.staging, record, backend, {**facts, **BACKENDS[backend].mixed_options}))
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


Measured = tuple[Table, Table, int]


def contended(cores: float | None) -> bool:
    """Whether other processes held CONTENDED cores or more (unknown load is not contention)."""
    return cores is not None and cores >= CONTENDED


def fair_measurement(measure: Callable[[], Measured],
                     watch: Callable[[], OtherLoad] = OtherLoad) -> tuple[Table, Table, int, list[float | None]]:
    """`measure`'s tables from a run that other processes left alone: while they (or the hypervisor) held
    CONTENDED cores or more, a pool of several threads stalls (ONNX Runtime's default pool has timed at over 3x its
    quiet latency so, enough to send `auto` to one thread) and the run is done again, up to TRIES runs, unless the
    load is still there PROBE_S later. The least loaded run is kept; the load of each run
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
    stalls (rlopt.backends.capability.Backend). `backends` are runnable here, so each is in the registry."""
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


def tune_backends(record: NetworkRecord, variants: Variants, alone: Table,
                  together: Table | None) -> tuple[dict[str, TunedRoute], Table, Table | None]:
    """Each backend with configurations of its own picks one per shape (`AutoTuning.choose`); the tables with its
    row as picked, for `choose_route` (its other configurations' rows stay, as measured)."""
    tuned: dict[str, TunedRoute] = {}
    ranked_alone, ranked_together = dict(alone), dict(together) if together else together
    for backend, names in variants.items():
        tuning = BACKENDS[backend].auto_tuning()
        keys = {name: subject_key(backend, name) for name in ["", *names]}
        rows_alone = {name: alone[key] for name, key in keys.items() if key in alone}
        rows_together = {name: together[key] for name, key in keys.items() if key in together} if together else None
        choice = tuning.choose(rows_alone, rows_together, record.artifacts[backend].bytes or 0) if tuning else None
        if choice is None:
            continue
        tuned[backend] = choice
        ranked_alone[backend] = dict(choice.alone)
        if ranked_together is not None and choice.together is not None:
            ranked_together[backend] = dict(choice.together)
    return tuned, ranked_alone, ranked_together


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
            if OTHER in labels and math.isfinite(unbucketed_p50(b, record.artifacts[b])):
                recorded[b][OTHER] = unbucketed_p50(b, record.artifacts[b])
        alone: Table = recorded
        together: Table | None = None
        rounds = 0
        why = "; ".join(f"{b} cannot run here" for b in verified if b not in candidates)
        contenders = [b for b in candidates if not outclassed(recorded, b, named)]
        pruned = [b for b in candidates if b not in contenders]
        variants = self.variants(record, contenders)
        load: list[float | None] = []
        if (len(contenders) > 1 or variants) and not why:
            try:
                alone, together, rounds, load = fair_measurement(
                    lambda: measure_configurations(ctx, record, contenders, labels, recorded, variants))
            except (BackendUnavailable, RuntimeError, OSError, ValueError) as exc:
                why = f"measuring failed: {first_line(exc)}"
        floors = stall_floors(record, contenders)  # a pool with no core to spare runs at one thread's speed
        alone, floored = at_least(alone, floors)
        together = at_least(together, floors)[0] if together else together
        tuned, ranked_alone, ranked_together = tune_backends(record, variants if not why else {}, alone, together)
        if load and contended(load[-1]):  # the tables stay recorded, the mix is not tried
            why, ranked_together = f"other processes held {load[-1]:.2f} cores through {len(load)} measurements", None
        reconfigured = frozenset(b for b in contenders if BACKENDS[b].mixed_options)
        choice = choose_route(ranked_alone, ranked_together, list(labels), contenders, why, reconfigured)
        routes = {label: choice.per_point[label] for label in named}
        routes[OTHER] = choice.per_point.get(OTHER, choice.per_point[at_opt])
        options = self.options(routes, choice.mixed, tuned)
        tuning_why = "".join(f"; {tuned[b].why}" for b in tuned if b in routes.values() and tuned[b].why)
        reason = choice.reason + tuning_why + (
            f"; not timed: {', '.join(pruned)} (over {OUTCLASSED:g}x slower everywhere)" if pruned else "") + (
            f"; counted at one thread's speed (a stalled pool): {', '.join(floored)}" if floored else "")
        measured = AutoChoiceFacts(mixed=choice.mixed, reason=reason, rounds=rounds, other_load_cores=load,
                                   stall_floor_us=floors, alone_us={b: dict(t) for b, t in alone.items()},
                                   together_us={b: dict(t) for b, t in (together or {}).items()})
        return StageOutput(None, {"route": RoutePlan(routes=routes, options=options, choice=measured),
                                  "selected": choice.per_point[at_opt]})

    @staticmethod
    def variants(record: NetworkRecord, contenders: list[str]) -> Variants:
        """Each contender's own configurations worth timing (`AutoTuning.variants`)."""
        found: Variants = {}
        for backend in contenders:
            tuning = BACKENDS[backend].auto_tuning()
            named = tuning.variants(facts_of(backend, record.artifacts[backend].facts), usable_cores()) if tuning \
                else {}
            if named:
                found[backend] = named
        return found

    @staticmethod
    def options(routes: dict[str, str], mixed: bool, tuned: dict[str, TunedRoute]) -> dict[str, dict[str, Any]]:
        """The facts each backend of the route opens with: its mixed-route options where the route mixes backends,
        and its own configuration per shape where it chose one."""
        options: dict[str, dict[str, Any]] = {}
        for backend in dict.fromkeys(routes.values()):
            update = dict(BACKENDS[backend].mixed_options) if mixed else {}
            if backend in tuned:
                update.update(tuned[backend].options([label for label, b in routes.items() if b == backend]))
            if update:
                options[backend] = update
        return options

    def detail(self, ctx: Context, out: StageOutput) -> str:
        choice = out.facts["route"].choice
        return choice.reason if choice is not None else ""


__all__ = ["CONTENDED", "OUTCLASSED", "TRIES", "ChooseAuto", "at_least", "contended", "fair_measurement",
           "has_other_shapes", "measure_configurations", "named_shapes", "outclassed", "stall_floors", "subject_key",
           "tune_backends"]
