"""`auto`'s route: which verified backend serves which shape, chosen from latencies measured in the configurations
a session can run, and how each backend of the route opens (the `auto` stage).

Every candidate is timed as every route opens it (`Backend.route_update`: TVM on its calling thread, whose pool would
stall beside a busy core), alone and all together, in passes until the route stops changing (`route_passes.py`); a
backend with configurations of its own (`Backend.auto`: ONNX Runtime's threads) has each timed and picks one per
shape. The choice rule is `rlopt.runtime.routes.choose_route`: another backend or configuration takes a shape only
when clearly faster (by the A/A noise, at least 5%), a one-thread challenger also in CPU time per call, so a busy
build machine does not move a shape. The stage is cached with the artifacts' hashes, this CPU and its usable cores
(a warm re-compile reuses the route; `rlopt compile --retime` measures again); the result is the network's
`RoutePlan`, which the runtime loads as recorded (`rlopt.runtime.recorded_plan`).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from rlopt.backends import BACKENDS, facts_of, unavailable_reason
from rlopt.backends.capability import TunedRoute
from rlopt.compile.latency import artifact_key
from rlopt.compile.route_passes import (CONTENDED, Measurement, Pass, Variants, aa_noise,
                                        on_calling_thread, pooled, route_facts, subject_key, until_stable)
from rlopt.errors import BackendUnavailable, first_line
from rlopt.facts import AutoChoiceFacts, AutoStageFacts, RoutePlan
from rlopt.machine import load_average, usable_cores
from rlopt.manifest import NetworkRecord, shape_label
from rlopt.reference import Reference
from rlopt.runtime import ranked_backends, unbucketed_p50
from rlopt.runtime.routes import NOISE, OTHER, Table, choose_route
from rlopt.stages.base import Context, Stage, StageOutput, package_digest

OUTCLASSED = 2.0  # a candidate this many times slower than another at every named shape is not timed


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


def contended(cores: float | None) -> bool:
    """Whether other processes held CONTENDED cores or more (unknown load is not contention)."""
    return cores is not None and cores >= CONTENDED


def outclassed(recorded: Table, backend: str, named: dict[str, str]) -> bool:
    """Whether `backend` timed over OUTCLASSED times another's latency at every named shape (compile's verify
    timings): it would win no shape, so the rounds that time every candidate skip it."""
    return any(other != backend and all(
        label in recorded[other] and recorded[backend].get(label, math.inf) > OUTCLASSED * recorded[other][label]
        for label in named) for other in recorded)


def margins_of(noise: Mapping[str, float]) -> dict[str, float]:
    """How much faster a configuration must be to take a shape: the A/A noise there, at least NOISE."""
    return {label: max(NOISE, round(value - 1.0, 4)) for label, value in noise.items()}


def one_thread_subjects(record: NetworkRecord, contenders: list[str], variants: Variants) -> dict[str, list[str]]:
    """Per backend, the keys of its subjects that compute on the calling thread alone (its own as the route opens
    it first, then its `variants`): their CPU time per call is what `choose_route` compares like with like."""
    found: dict[str, list[str]] = {}
    for backend in contenders:
        base = route_facts(record, backend)
        for name, update in {"": {}, **variants.get(backend, {})}.items():
            if on_calling_thread(backend, {**base, **update}):
                found.setdefault(backend, []).append(subject_key(backend, name))
    return found


def tune_backends(record: NetworkRecord, variants: Variants, alone: Table, together: Table | None,
                  margins: Mapping[str, float] | None = None, cpu: Table | None = None,
                  loaded: bool = False) -> tuple[dict[str, TunedRoute], Table, Table | None]:
    """Each backend with configurations of its own picks one per shape (`AutoTuning.choose`; `loaded`: other
    processes held a core through the measurement); the tables with its row as picked, for `choose_route` (its
    other configurations' rows stay, as measured)."""
    tuned: dict[str, TunedRoute] = {}
    ranked_alone, ranked_together = dict(alone), dict(together) if together else together
    for backend, names in variants.items():
        tuning = BACKENDS[backend].auto_tuning()
        keys = {name: subject_key(backend, name) for name in ["", *names]}
        rows_alone = {name: alone[key] for name, key in keys.items() if key in alone}
        rows_together = {name: together[key] for name, key in keys.items() if key in together} if together else None
        rows_cpu = {name: (cpu or {})[key] for name, key in keys.items() if key in (cpu or {})}
        choice = tuning.choose(rows_alone, rows_together, record.artifacts[backend].bytes or 0, margins, rows_cpu,
                               loaded) if tuning else None
        if choice is None:
            continue
        tuned[backend] = choice
        ranked_alone[backend] = dict(choice.alone)
        if ranked_together is not None and choice.together is not None:
            ranked_together[backend] = dict(choice.together)
    return tuned, ranked_alone, ranked_together


@dataclass(frozen=True)
class Decision:
    """A route decided from one set of tables: equal when routes and options are (what passes must agree on)."""

    routes: dict[str, str]
    options: dict[str, dict[str, Any]]
    mixed: bool = field(compare=False)
    reason: str = field(compare=False)
    selected: str = field(compare=False)


@dataclass(frozen=True)
class Question:
    """What `decide` needs besides the tables: the network, its candidates and their own configurations, the shape
    labels timed (named ones and OTHER) and the label at opt, and why the mix cannot be measured (if so)."""

    record: NetworkRecord
    contenders: list[str]
    variants: Variants
    labels: dict[str, str]
    named: dict[str, str]
    at_opt: str
    why: str = ""

    def decide(self, measured: Pass) -> Decision:
        """The route these tables give (`tune_backends`, then `choose_route`)."""
        margins = margins_of(aa_noise(measured.alone))
        variants = self.variants if not self.why else {}
        single = one_thread_subjects(self.record, self.contenders, variants)
        one_thread_cpu = {key: measured.cpu[key] for keys in single.values() for key in keys if key in measured.cpu}
        tuned, alone, together = tune_backends(self.record, variants, measured.alone, measured.together or None,
                                               margins, one_thread_cpu, contended(measured.load))
        cpu = {backend: measured.cpu[keys[0]] for backend, keys in single.items() if keys[0] in measured.cpu}
        pools = {backend: [label for label, name in tuned[backend].configurations.items()
                           if subject_key(backend, name) not in single.get(backend, [])] for backend in tuned}
        preferred = [b for b in self.contenders if BACKENDS[b].holds_ties]
        companions = {b for b in self.contenders
                      if on_calling_thread(b, route_facts(self.record, b))}
        rivals = [b for b in self.contenders if BACKENDS[b].bench_peer]  # a peer users would pick may hold it
        choice = choose_route(alone, together if not self.why else None, list(self.labels), self.contenders,
                              self.why, margins, preferred, cpu, pools, companions, rivals)
        routes = {label: choice.per_point[label] for label in self.named}
        routes[OTHER] = choice.per_point.get(OTHER, choice.per_point[self.at_opt])
        options = ChooseAuto.options(routes, tuned)
        for backend in set(routes.values()):  # every route opens it so (as timed): TVM on its calling thread
            update = BACKENDS[backend].route_update(self.record.artifacts[backend].facts)  # only what changes
            if update:
                options[backend] = {**update, **options.get(backend, {})}
        tuning_why = "".join(f"; {tuned[b].why}" for b in tuned if b in routes.values() and tuned[b].why)
        return Decision(routes, options, choice.mixed, choice.reason + tuning_why, choice.per_point[self.at_opt])


class ChooseAuto(Stage):
    """`auto`'s route, from latencies measured in the configurations a session can run (`choose_route`); the
    runtime loads exactly what is recorded (`rlopt.runtime.recorded_plan`). Cached: the key holds every verified
    artifact's identity and facts, the reference, this CPU (`machine_dependent`) and its usable cores."""

    name, cached, machine_dependent, facts_model = "auto", True, True, AutoStageFacts
    helpers = ("rlopt.compile.route_passes", "rlopt.compile.rounds", "rlopt.compile.apart", "rlopt.compile.latency",
               "rlopt.runtime.routes", "rlopt.backends", "rlopt.backends.base", "rlopt.backends.capability",
               "rlopt.machine", "rlopt.facts", "rlopt.arrays", "rlopt.timing", "rlopt.onnx_session")

    def __init__(self, record: NetworkRecord, identities: Mapping[str, Any] | None = None) -> None:
        self.record, self.identities = record, dict(identities or {})

    def config(self, ctx: Context) -> Any:
        """The key: per verified backend its artifact's identity (its build's `artifact_identity`, else the sha256 of
        its file and companions), facts, verify's latency, runner code and library versions; the inputs, the
        reference, the runtime's code and the usable cores (this CPU joins as `machine_dependent`)."""
        verified = ranked_backends(self.record)
        artifacts = {b: {**artifact_key(self.record, b, self.identities),
                         "latency_us": {p: v.model_dump(mode="json")
                                        for p, v in self.record.artifacts[b].latency_us.items()}} for b in verified}
        return {"artifacts": artifacts, "order": verified, "inputs": {n: p.model_dump(mode="json")
                                                                      for n, p in self.record.inputs.items()},
                "reference": self.record.reference.sha256 if self.record.reference else None,
                "cores": usable_cores(), "runtime": package_digest("rlopt.runtime.session")}

    def upstream(self, ctx: Context) -> dict[str, Any]:
        return {}

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
        why = "; ".join(f"{b} cannot run here" for b in verified if b not in candidates)
        contenders = [b for b in candidates if not outclassed(recorded, b, named)]
        pruned = [b for b in candidates if b not in contenders]
        variants = self.variants(record, contenders)
        measured_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
        question = Question(record, contenders, variants, labels, named, at_opt, why)
        settled = None
        if (len(contenders) > 1 or variants) and not why:
            try:
                with Measurement(ctx, record, contenders, labels, recorded, variants) as measurement:
                    settled = until_stable(measurement.measure, question.decide)
            except (BackendUnavailable, RuntimeError, OSError, ValueError) as exc:
                question = Question(record, contenders, variants, labels, named, at_opt,
                                    f"measuring failed: {first_line(exc)}")
        if settled is None or settled.decision is None:
            tables = Pass(recorded, {}, {}, 0)
            decision = question.decide(tables)
        else:
            decision, tables = settled.decision, pooled(settled.kept)
        reason = decision.reason + (f"; not timed: {', '.join(pruned)} (over {OUTCLASSED:g}x slower everywhere)"
                                    if pruned else "")
        loads = [p.load for p in settled.passes] if settled else []
        if settled is not None:
            reason += (f"; {len(settled.passes)} passes, " + ("stable" if settled.stable else
                       f"not stable after {len(settled.passes)} (the kept passes pooled)"))
            if any(contended(load) for load in loads):
                reason += f"; other processes held {max(x for x in loads if x is not None):.2f} cores at most"
        one_thread = {k for keys in one_thread_subjects(record, contenders, variants).values() for k in keys}
        cpu = {k: dict(v) for k, v in tables.cpu.items() if k in one_thread}
        measured = AutoChoiceFacts(
            mixed=decision.mixed, reason=reason, rounds=tables.rounds, measured_at=measured_at, cores=usable_cores(),
            load_average=load_average(), passes=len(settled.passes) if settled else 0,
            stable=settled.stable if settled else None, other_load_cores=loads, aa_noise=aa_noise(tables.alone),
            alone_us={b: dict(t) for b, t in tables.alone.items()},
            together_us={b: dict(t) for b, t in tables.together.items()}, cpu_us=cpu)
        plan = RoutePlan(routes=decision.routes, options=decision.options, choice=measured)
        return StageOutput(None, AutoStageFacts(route=plan, selected=decision.selected))

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
    def options(routes: dict[str, str], tuned: dict[str, TunedRoute]) -> dict[str, dict[str, Any]]:
        """Each backend of the route's own configuration per shape, where it chose one (`AutoTuning`)."""
        options: dict[str, dict[str, Any]] = {}
        for backend in dict.fromkeys(routes.values()):
            if backend in tuned:
                update = tuned[backend].options([label for label, b in routes.items() if b == backend])
                if update:
                    options[backend] = update
        return options

    def detail(self, ctx: Context, out: StageOutput) -> str:
        choice = out.facts.route.choice
        return choice.reason if choice is not None else ""



__all__ = ["CONTENDED", "OUTCLASSED", "ChooseAuto", "Decision", "Question", "contended", "has_other_shapes",
           "margins_of", "named_shapes", "one_thread_subjects", "outclassed", "subject_key", "tune_backends"]
