"""`auto`: which verified backend serves which shape, and the facts each backend of the route opens with.

Compile chooses (`choose_route`, from latencies measured in each configuration a session can run) and records
the choice in the manifest (`facts.route`, a RoutePlan); `recorded_plan` reads it back at load time and never
re-chooses (reads only the manifest).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlopt.arrays import ShapeKey, parse_label
from rlopt.backends import facts_of
from rlopt.backends.capability import POOL_WORTH_US, clearly_faster
from rlopt.facts import OTHER, ArtifactFacts
from rlopt.manifest import BackendRecord, NetworkRecord

NOISE = 0.05  # the least margin: another backend or configuration must be this much faster to take a shape
GAIN = 0.10  # a mixed route must be at least this much faster at some shape to be worth a second backend


def ranked_backends(record: NetworkRecord) -> list[str]:
    """Verified backends, fastest first at the opt shape (the manifest's `selected` leads)."""

    def opt_p50(name: str) -> float:
        latency = record.artifacts[name].latency_us.get("opt")
        return latency.p50 if latency else float("inf")

    verified = sorted((n for n, r in record.artifacts.items() if r.verified), key=opt_p50)
    if record.selected in verified:
        verified.remove(record.selected)
        verified.insert(0, record.selected)
    return verified


def unbucketed_variant(backend: str, facts: ArtifactFacts | Mapping[str, Any]) -> str | None:
    """The code path of `backend`'s artifact that serves shapes without a build of their own (its facts'
    `serving_variant`: TVM's 'padded' or 'dynamic'); None where the artifact itself serves every shape."""
    return facts_of(backend, facts).serving_variant()


def unbucketed_p50(backend: str, artifact: BackendRecord) -> float:
    """Latency at the opt shape, measured alone, through the code path that serves shapes without their own build
    (`facts.variant_latency_us` of that path; unmeasured = inf), else the artifact's own."""
    facts = facts_of(backend, artifact.facts)
    variant = facts.serving_variant()
    if variant is not None:
        value = facts.variant_latency_us.get(variant, {}).get("opt")
        return float(value) if value else float("inf")
    latency = artifact.latency_us.get("opt")
    return latency.p50 if latency else float("inf")


Table = Mapping[str, Mapping[str, float]]  # backend -> point (or OTHER) -> median latency in us


@dataclass(frozen=True)
class RouteChoice:
    """Compile's verdict: a backend per point (OTHER included), whether that mixes backends, and why."""

    per_point: dict[str, str]
    mixed: bool
    reason: str
    single: str
    compared: dict[str, float] = field(default_factory=dict)  # point -> mixed / single latency ratio


def _geomean(values: list[float]) -> float:
    return float(np.exp(np.mean(np.log(np.maximum(values, 1e-9)))))


def _single_candidates(alone: Table, points: list[str], order: list[str]) -> list[str]:
    """Backends that serve every point, best first (geometric mean over the points; ties keep `order`)."""
    serving = [b for b in order if b in alone and all(p in alone[b] for p in points)]
    return sorted(serving, key=lambda b: (_geomean([alone[b][p] for p in points]), order.index(b)))


def _figures(alone: Table, together: Table | None, name: str, point: str) -> list[float]:
    """`name`'s latencies at `point`: alone, and together where that was measured."""
    return [t[name][point] for t in (alone, together or {}) if point in t.get(name, {})]


def _holder(alone: Table, singles: list[str], points: list[str], preferred: Sequence[str], margin: float,
            cpu: Table, pools: Mapping[str, Collection[str]], together: Table | None = None) -> str:
    """The single backend every shape stays on unless another is clearly faster there: the first `preferred` one
    that serves every point, unless the fastest single backend (geometric mean) is clearly faster, its slower figure
    per point (alone or together) against the preferred one's faster, also in CPU time per call where both have a
    one-thread figure (and the fastest runs no pool); else that fastest one."""
    fastest = singles[0]
    keep = next((b for b in preferred if b in singles), None)
    if keep is None or keep == fastest:
        return fastest

    def geo(table: Table, name: str) -> float | None:
        row = table.get(name, {})
        return _geomean([row[p] for p in points]) if all(p in row for p in points) else None

    def bound(name: str, pick: Any) -> float:  # geometric mean of each point's slower (max) or faster (min) figure
        return _geomean([pick(_figures(alone, together, name, p)) for p in points])

    mine, theirs = None if pools.get(fastest) else geo(cpu, fastest), geo(cpu, keep)
    beats = clearly_faster(bound(fastest, max), bound(keep, min), margin)
    return fastest if beats and (mine is None or theirs is None or clearly_faster(mine, theirs, margin)) else keep


def choose_route(alone: Table, together: Table | None, points: list[str], order: list[str],
                 unmeasured: str = "", margins: Mapping[str, float] | None = None, preferred: Sequence[str] = (),
                 cpu: Table | None = None, pools: Mapping[str, Collection[str]] | None = None,
                 companions: Collection[str] | None = None, rivals: Collection[str] | None = None) -> RouteChoice:
    """The route `auto` runs, from latencies measured in the configurations a session can run.

    `alone[b]`: every point on backend b alone (its pools as when alone: ONNX Runtime spinning); `together[b]`: b's
    latency with the candidates a mix can hold loaded in one process, points interleaved; None when that could not be
    measured (`unmeasured` says why). A point missing from a backend's table is one it does not serve. `order`: the
    candidates, best first. `margins[p]`: how much faster another backend must be at p to take it (at least NOISE;
    the measurement's A/A noise widens it). `cpu[b][p]`: the CPU time per call of b's configuration that computes on
    the calling thread alone (where it has one), a figure other processes' load does not move; `pools[b]`: the points
    where b's route runs a pool instead (its CPU figure does not say how fast it runs there). `companions`: the
    backends that may join the holder in a mix (None: any); `auto` admits those that compute on the calling thread
    alone, so a route never holds two pools that would fight over the cores, and every backend of a mix runs as it
    does alone.

    Every shape stays on one holder (`_holder`: the first `preferred` backend, the peer users compare against,
    unless another single backend is clearly faster overall) unless a companion is clearly faster there: its slower
    figure of the two beats the holder's faster one by the margin (one lucky timing must not move a shape), and,
    where both have a one-thread CPU figure, by the margin in CPU time too (a pool timed beside a busy core reads
    slower; a one-thread challenger must not win a shape by that alone). OTHER (the shapes without a point of their
    own) is decided like a named point. A backend of `rivals` (None: any) with a pool of its own may hold the
    route instead, its companions taking their shapes as before, where over the shapes the two routes serve
    differently the worst shape of the route it holds (latency over the fastest figure any candidate has there) is
    clearly better: a pool that beats the holder's at an MLP's 256 rows and loses at batch 1, where a one-thread
    configuration joins it. A tuned backend (`pools` names its pool shapes) joins as a companion only where its
    chosen configuration computes on the calling thread. A companion also takes a shape where the holder runs a
    pool and the companion's one-thread call (under POOL_WORTH_US) is not clearly slower, in wall time and in CPU
    time: the same speed on half the cores with no second core to wait on, and a choice that stays put when the
    two read within the noise of each other (the default value head's TVM against ONNX Runtime's pool at batch 1
    read 16.75 against 17.14 us in one compile and 14.27 against 19.26 in the next). The mix is kept when it is at
    least GAIN faster at one point or holds such a tie, else (and whenever the mix could not be measured) every
    shape goes to the holder.
    """
    margin = {p: max(NOISE, (margins or {}).get(p, NOISE)) for p in points}
    overall = max(NOISE, float(np.median(list(margin.values())))) if margin else NOISE
    cpu, pools = cpu or {}, pools or {}
    singles = _single_candidates(alone, points, order)
    if together is None or not together:
        best = _holder(alone, singles, points, preferred, overall, cpu, pools) if singles else next(
            b for b in order if b in alone)
        why = f"mixed route not measured ({unmeasured})" if unmeasured else "one candidate backend"
        return RouteChoice(dict.fromkeys(points, best), False, f"{best} alone: {why}", best)

    def figures(name: str, point: str) -> list[float]:
        return _figures(alone, together, name, point)

    def joins(name: str, point: str) -> bool:  # a companion there: computes on the calling thread alone
        return companions is None or name in companions or (name in pools and point not in pools[name])

    def wins(name: str, point: str, holder: str) -> bool:
        if not clearly_faster(max(figures(name, point)), min(figures(holder, point)), margin[point]):
            return False
        mine = cpu.get(name, {}).get(point) if point not in pools.get(name, ()) else None
        theirs = cpu.get(holder, {}).get(point)
        return mine is None or theirs is None or clearly_faster(mine, theirs, margin[point])

    def pooled(name: str, point: str) -> bool:  # runs a pool there (unknown without companions: no)
        return point in pools[name] if name in pools else companions is not None and name not in companions

    def ties(name: str, point: str, holder: str) -> bool:
        """A one-thread call under POOL_WORTH_US, not clearly slower than the holder's pool there (wall time: the
        holder's faster figure against the companion's slower one; CPU time against the holder's one-thread
        configuration)."""
        if point in pools.get(name, ()) or not pooled(holder, point):
            return False
        mine = cpu.get(name, {}).get(point)
        if (mine if mine is not None else max(figures(name, point))) >= POOL_WORTH_US:
            return False
        if clearly_faster(min(figures(holder, point)), max(figures(name, point)), margin[point]):
            return False
        theirs = cpu.get(holder, {}).get(point)
        return mine is None or theirs is None or not clearly_faster(theirs, mine, margin[point])

    def takes(name: str, point: str, holder: str) -> bool:
        return joins(name, point) and (wins(name, point, holder) or ties(name, point, holder))

    def route_of(best: str) -> dict[str, str]:
        mix = {}
        for point in points:
            serving = [b for b in order if point in together.get(b, {})]
            if best and point in alone.get(best, {}):
                holder = best
            elif serving:
                holder = min(serving, key=lambda b: (max(figures(b, point)), order.index(b)))
            else:
                continue
            challengers = [b for b in serving if b != holder and takes(b, point, holder)]
            mix[point] = min(challengers, key=lambda b: (max(figures(b, point)), order.index(b))) if challengers \
                else holder
        return mix

    def cost(mix: dict[str, str], holder: str, point: str) -> float:  # as the GAIN rule charges it
        name = mix[point]
        return min(figures(name, point)) if name == holder else max(figures(name, point))

    def worst(mix: dict[str, str], holder: str, over: list[str]) -> float:
        """The route's worst shape among `over`: its latency over the fastest figure any candidate has there."""
        return max(cost(mix, holder, p) / min(min(figures(b, p)) for b in alone if figures(b, p)) for p in over)

    best = _holder(alone, singles, points, preferred, overall, cpu, pools, together) if singles else ""
    mix = route_of(best)
    switched = ""
    if best and companions is not None and len(mix) == len(points):
        # A backend with a pool of its own can hold the route instead (one pool per route still); it does where,
        # over the shapes the two routes serve differently, the worst shape of the route it holds is clearly better.
        verdicts = {}
        for other in (h for h in singles if h != best and h not in companions and (rivals is None or h in rivals)):
            theirs = route_of(other)
            apart = [p for p in points if p in theirs and theirs[p] != mix.get(p)]
            if len(theirs) == len(points) and apart:
                verdicts[other] = (worst(theirs, other, apart), worst(mix, best, apart), theirs)
        if verdicts:
            holder = min(verdicts, key=lambda h: (verdicts[h][0] / verdicts[h][1], order.index(h)))
            new, old, theirs = verdicts[holder]
            if clearly_faster(new, old, overall):
                switched = (f"{holder} holds (where the routes differ, its worst shape is {new:.2f}x the fastest "
                            f"there, {best}'s {old:.2f}x); ")
                best, mix = holder, theirs
    if not singles:
        missing = [p for p in points if p not in mix]
        if missing:
            raise ValueError(f"no candidate backend serves {missing}")
        return RouteChoice(mix, len(set(mix.values())) > 1, "mixed: no single backend serves every shape",
                           mix[points[0]])
    if len(mix) < len(points) or set(mix.values()) == {best}:
        return RouteChoice(dict.fromkeys(points, best), False, f"{switched}{best} alone: no other backend clearly "
                           f"faster at any shape", best)
    tied = [p for p in points if mix[p] != best and not wins(mix[p], p, best)]
    within = f" (one thread within the noise of {best}'s pool at {', '.join(tied)})" if tied else ""
    if len(set(mix.values())) == 1:
        only = next(iter(mix.values()))
        return RouteChoice(dict.fromkeys(points, only), False, f"{only} alone: clearly faster than {best} at every "
                           f"shape{within}", only)
    ratios = {p: cost(mix, best, p) / min(figures(best, p)) for p in points}  # 1 where the holder keeps the shape
    table = ", ".join(f"{p} {ratios[p]:.2f}x" for p in points)
    if min(ratios.values()) <= 1 - GAIN or tied:
        return RouteChoice(mix, True, f"{switched}mixed kept, vs {best} alone: {table}{within}", best, ratios)
    return RouteChoice(dict.fromkeys(points, best), False, f"{switched}{best} alone: the mix was under {GAIN:.0%} "
                       f"faster anywhere ({table})", best, ratios)


@dataclass(frozen=True)
class AutoPlan:
    """What `auto` loads: a backend per named shape, one for every other shape, and the facts each backend of the
    route opens with over its artifact's (`RoutePlan.options`)."""

    routes: dict[ShapeKey, str]
    fallback: str
    why: str = ""
    options: dict[str, dict[str, Any]] = field(default_factory=dict)


def recorded_plan(record: NetworkRecord, usable: list[str]) -> AutoPlan:
    """The route compile measured and chose (`facts.route`).

    When the manifest records no route, or names a backend that cannot run here (`usable`: verified and runnable,
    best first), every shape goes to the best usable backend on its own, as built: a mix was never measured on this
    machine.
    """
    route = record.facts.route
    table = dict(route.routes) if route is not None else {}
    fallback = table.pop(OTHER, None)
    needed = {fallback, *table.values()}
    if route is None or fallback is None or not needed <= set(usable):
        lost = sorted(str(b) for b in needed - set(usable)) if fallback is not None else []
        why = f"recorded route needs {', '.join(lost)}, which cannot run here" if lost else "no recorded route"
        return AutoPlan({}, usable[0], f"{usable[0]} alone: {why}")
    routes = {parse_label(label): name for label, name in table.items()}
    return AutoPlan(routes, fallback, "recorded", {b: dict(o) for b, o in route.options.items() if b in needed})


__all__ = ["GAIN", "NOISE", "OTHER", "AutoPlan", "RouteChoice", "choose_route", "parse_label", "ranked_backends",
           "recorded_plan", "unbucketed_p50", "unbucketed_variant"]
