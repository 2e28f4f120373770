"""`auto`'s measurement: each candidate configuration timed alone and all together in interleaved rounds, in passes
until the route they decide stops changing.

One pass is `Measurement.measure`: every subject (a candidate backend as a route opens it, and each of its own
configurations) timed alone (of a backend declared `timed_apart`, each subject in a worker process of its own,
`apart.py`) and, with several candidates, all together in this process; one subject is timed twice alone (its A/A twin), so the pass says
how far two copies of one configuration read apart. `until_stable` takes passes until adding one leaves the route
unchanged (at least MIN_PASSES: one measurement never decides alone) or MAX_PASSES were taken (the route is then
flagged not stable); a pass during which other processes held CONTENDED cores more than the least loaded pass is
not pooled (a burst), while a load that stays through every pass is the machine's state and is measured as such.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

import numpy as np

from rlopt.backends import BACKENDS, Runner, facts_of
from rlopt.backends.capability import Table
from rlopt.compile import apart
from rlopt.compile.apart import apart_rounds, release_apart
from rlopt.compile.rounds import Cells, Subjects, configuration_rounds, drive_rounds, open_subject, subject_cells
from rlopt.errors import UsageError
from rlopt.machine import OtherLoad
from rlopt.manifest import NetworkRecord
from rlopt.stages.base import Context

ROUNDS = 400  # per pass at most: the rounds go on until PASS_BUDGET_S is spent (`Measurement.measure`)
PASS_BUDGET_S = 1.0  # no round of a pass starts after this long
MIN_PASSES, MAX_PASSES = 2, 3
PASSES_ENV = "RLOPT_ROUTE_PASSES"  # at most this many passes (1-3): a quicker compile whose route one pass decides
CONTENDED = 0.25  # cores' worth of other processes' CPU (or hypervisor steal) that marks a pass as loaded
AA = " (A/A)"  # the key suffix of a subject's twin: the same configuration, opened again
Variants = dict[str, dict[str, dict[str, Any]]]  # backend -> configuration name -> facts update
Decision = TypeVar("Decision")


def subject_key(backend: str, configuration: str = "") -> str:
    """How the tables name a backend's configuration: '<backend> <configuration>' ('<backend>' for its own)."""
    return f"{backend} {configuration}" if configuration else backend


@dataclass(frozen=True)
class Pass:
    """One pass's medians per subject and shape label: alone (twin included), together (empty with one candidate
    and no other configuration timed here), the calling thread's CPU time per call (alone), the rounds done (the
    fewer of the two measurements) and the cores other processes held meanwhile (None: unknown)."""

    alone: Table
    together: Table
    cpu: Table
    rounds: int
    load: float | None = None


def on_calling_thread(backend: str, facts: Mapping[str, Any]) -> bool:
    """Whether `backend` opened with `facts` computes on the calling thread alone (`Backend.threads` is 1)."""
    return BACKENDS[backend].threads(facts_of(backend, facts)) == 1


def mixable(subjects: Subjects) -> list[str]:
    """The subjects a mixed route can hold: those of a backend that holds ties (a route's holder) and those that
    compute on the calling thread alone (its companions): two pools in one route would fight over the cores."""
    keys = [k for k, (backend, facts) in subjects.items()
            if BACKENDS[backend].holds_ties or on_calling_thread(backend, facts)]
    return keys if len({subjects[k][0] for k in keys}) > 1 else []


def route_facts(record: NetworkRecord, backend: str) -> dict[str, Any]:
    """`backend`'s facts as every route opens it (`Backend.route_update` over its artifact's: TVM on one thread)."""
    facts = record.artifacts[backend].facts
    return {**facts.as_dict(), **BACKENDS[backend].route_update(facts)}


def route_subjects(record: NetworkRecord, candidates: list[str], variants: Variants | None = None) -> Subjects:
    """Each candidate as every route opens it (`route_facts`), and each of its own configurations (`variants`),
    keyed `subject_key`."""
    subjects: Subjects = {}
    for backend in candidates:
        base = route_facts(record, backend)
        subjects[backend] = (backend, base)
        for name, update in (variants or {}).get(backend, {}).items():
            subjects[subject_key(backend, name)] = (backend, {**base, **update})
    return subjects


class Measurement:
    """One network's subjects opened for `auto`'s passes (a context: every runner is closed at its end, and the
    worker's): `measure` is one pass, `alone[k]` (each subject's pools as when alone, and `<first subject timed
    apart, else first>` + AA, its twin), `together[k]` (the `mixable` subjects open in this process, cells
    interleaved) and `cpu[k]` (alone), median us per shape label. The runners stay open between passes.

    A backend `timed_apart` is timed alone, each of its subjects (its twin too) in a process that opens nothing else,
    as a session routed to it alone runs it: ONNX Runtime's spinning pool timed in this process shared the cores
    with the idle pools of the other candidates and sessions (the default policy at 8x16x768 on znver2: 1173 us here
    against 486-696 us in processes of its own), and two of its pools in one worker with each other's."""

    def __init__(self, ctx: Context, record: NetworkRecord, candidates: list[str], labels: dict[str, str],
                 estimates_us: Table | None = None, variants: Variants | None = None,
                 budget_s: float | None = None) -> None:
        self.ctx, self.record, self.labels, self.estimates_us = ctx, record, labels, estimates_us
        self.budget_s = PASS_BUDGET_S if budget_s is None else budget_s
        self.subjects = route_subjects(record, candidates, variants)
        self.fresh = {k: v for k, v in self.subjects.items() if BACKENDS[v[0]].timed_apart and apart.ENABLED}
        self.here = {k: v for k, v in self.subjects.items() if k not in self.fresh}
        twinned = next(iter(self.fresh or self.here))
        (self.fresh if self.fresh else self.here)[twinned + AA] = self.subjects[twinned]
        self.mixed = mixable(self.subjects)
        if not self.mixed and set(self.here) <= {twinned + AA}:  # nothing to mix, nothing to time alone here
            self.here = {}
        self.opened: list[Runner] = []
        self.configurations: dict[str, Cells] = {}

    def __enter__(self) -> Measurement:
        try:
            runners: dict[str, Runner] = {}
            for key in dict.fromkeys([*self.mixed, *self.here]):  # a mix opens each backend as alone does
                backend, facts = self.subjects.get(key) or self.here[key]
                self.opened.append(open_subject(self.ctx.staging, self.record, backend, facts))
                runners[key] = self.opened[-1]

            def cells_of(key: str) -> Cells:  # a Session of its own for each configuration, as the runtime opens them
                backend = (self.subjects.get(key) or self.here[key])[0]
                return subject_cells(key, runners[key], backend, self.record, self.ctx.reference, self.labels)

            self.configurations = {f"alone {k}": cells_of(k) for k in self.here}
            if self.mixed:
                self.configurations["together"] = {cell: call for k in self.mixed for cell, call in cells_of(k).items()}
        except BaseException:
            self.__exit__()
            raise
        return self

    def measure(self) -> Pass:
        """One pass: the workers' subjects and this process's configurations visited in the same rounds, which go
        on until the pass's budget is spent (at most ROUNDS): this host's speed moves in phases of 0.25-1 s, and a
        pass of a tiny network's 8 rounds took 0.1 s, all inside one phase, with the workers' rounds and this
        process's in two phases one after the other."""
        here = configuration_rounds(self.configurations, self.estimates_us)
        if self.fresh:
            result = apart_rounds(self.ctx.staging, self.record, self.fresh, self.labels, self.estimates_us,
                                  self.budget_s, ROUNDS, keep=True, alongside=here)
        else:
            result = drive_rounds(here, ROUNDS, self.budget_s)
        walls, cpus = result.medians(), result.medians(cpu=True)

        def table(medians: Table, keys: Sequence[str], config: str | None = None) -> Table:
            if config is None:  # a worker's subject: its figures per shape label
                return {k: dict(medians[k]) for k in keys}
            return {k: {label: medians[config.format(k)][k, label] for label in self.labels}  # type: ignore[index]
                    for k in keys}

        return Pass({**table(walls, list(self.fresh)), **table(walls, list(self.here), "alone {}")},
                    table(walls, self.mixed, "together") if self.mixed else {},
                    {**table(cpus, list(self.fresh)), **table(cpus, list(self.here), "alone {}")}, result.done)

    def __exit__(self, *exc: object) -> None:
        for runner in self.opened:
            runner.close()
        self.opened, self.configurations = [], {}
        if self.fresh:
            release_apart()


def measure_configurations(ctx: Context, record: NetworkRecord, candidates: list[str], labels: dict[str, str],
                           estimates_us: Table | None = None, variants: Variants | None = None,
                           budget_s: float | None = None) -> Pass:
    """One pass of a `Measurement`, its runners closed after."""
    with Measurement(ctx, record, candidates, labels, estimates_us, variants, budget_s) as measurement:
        return measurement.measure()


def pooled(passes: Sequence[Pass]) -> Pass:
    """The passes as one: each figure the median of its passes' (a figure some pass lacks: of those that have it);
    rounds summed; the load the most any pass saw."""
    def median_of(tables: list[Table]) -> Table:
        keys = dict.fromkeys(k for t in tables for k in t)
        return {k: {label: round(float(np.median([t[k][label] for t in tables if label in t.get(k, {})])), 2)
                    for label in dict.fromkeys(lb for t in tables for lb in t.get(k, {}))} for k in keys}

    loads = [p.load for p in passes if p.load is not None]
    return Pass(median_of([p.alone for p in passes]), median_of([p.together for p in passes]),
                median_of([p.cpu for p in passes]), sum(p.rounds for p in passes), max(loads) if loads else None)


def aa_noise(alone: Table) -> dict[str, float]:
    """Per shape label, max(A/A, 1 / A/A) of the subject timed twice (empty when none was)."""
    twin = next((k for k in alone if k.endswith(AA)), None)
    if twin is None or twin.removesuffix(AA) not in alone:
        return {}
    first, second = alone[twin.removesuffix(AA)], alone[twin]
    return {label: round(max(second[label] / first[label], first[label] / second[label]), 3)
            for label in first if label in second and first[label] > 0 and second[label] > 0}


def kept_passes(passes: Sequence[Pass]) -> list[Pass]:
    """The passes pooled: those whose load is within CONTENDED of the least loaded one's (unknown load: 0)."""
    least = min((p.load or 0.0) for p in passes)
    return [p for p in passes if (p.load or 0.0) < least + CONTENDED]


@dataclass
class Settled(Generic[Decision]):
    """What `until_stable` settled on: every pass in order, those pooled, the decision on their pool, and whether
    the last pass left it unchanged."""

    passes: list[Pass] = field(default_factory=list)
    kept: list[Pass] = field(default_factory=list)
    decision: Decision | None = None
    stable: bool = False


def most_passes() -> int:
    """MAX_PASSES, or `$RLOPT_ROUTE_PASSES` (1-3) where set."""
    raw = os.environ.get(PASSES_ENV, "").strip()
    if not raw:
        return MAX_PASSES
    if not raw.isdigit() or not 1 <= int(raw) <= MAX_PASSES:
        raise UsageError(f"${PASSES_ENV}={raw!r}: expected a whole number of passes from 1 to {MAX_PASSES}; "
                          f"unset it for the default ({MIN_PASSES} to {MAX_PASSES} until the route is stable)")
    return int(raw)


def until_stable(measure: Callable[[], Pass], decide: Callable[[Pass], Decision],
                 watch: Callable[[], OtherLoad] = OtherLoad) -> Settled[Decision]:
    """Passes of `measure` until the decision on the kept passes pooled is the one the kept passes before the newest
    gave (at least MIN_PASSES kept; a pass not kept adds nothing), or `most_passes` were taken (with one allowed, it
    decides alone and the route is flagged not stable)."""
    most = most_passes()
    settled: Settled[Decision] = Settled()
    while len(settled.passes) < most:
        with watch() as load:
            measured = measure()
        settled.passes.append(replace(measured, load=None if load.cores is None else round(load.cores, 3)))
        settled.kept = kept_passes(settled.passes)
        settled.decision = decide(pooled(settled.kept))
        newest_kept = settled.kept[-1] is settled.passes[-1]
        if len(settled.kept) >= MIN_PASSES and newest_kept and settled.decision == decide(pooled(settled.kept[:-1])):
            settled.stable = True
            break
    return settled


__all__ = ["AA", "CONTENDED", "MAX_PASSES", "MIN_PASSES", "PASSES_ENV", "PASS_BUDGET_S", "ROUNDS", "Pass", "Settled", "Variants",
           "Measurement", "aa_noise", "kept_passes", "measure_configurations", "mixable", "on_calling_thread", "most_passes", "pooled",
           "route_facts", "route_subjects", "subject_key", "until_stable"]
