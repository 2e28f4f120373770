"""`auto`: which verified backend serves which shape, and the facts each backend of the route opens with.

Compile chooses (`choose_route`, from latencies measured in each configuration a session can run) and records
the choice in the manifest (`facts.route`, a RoutePlan); `recorded_plan` reads it back at load time and never
re-chooses (reads only the manifest).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlopt.arrays import ShapeKey, parse_label
from rlopt.backends import facts_of
from rlopt.facts import OTHER, ArtifactFacts
from rlopt.manifest import BackendRecord, NetworkRecord

NOISE = 0.05  # a mixed route may be this much slower than the best single backend at a shape (timing noise)
GAIN = 0.10  # ...and must be at least this much faster at some shape to be worth a second backend


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


def choose_route(alone: Table, together: Table | None, points: list[str], order: list[str],
                 unmeasured: str = "", reconfigured: frozenset[str] = frozenset()) -> RouteChoice:
    """The route `auto` runs, from latencies measured in the configurations a session can run.

    `alone[b]`: every point on backend b, its pools configured for running alone (ONNX Runtime spinning);
    `together[b]`: b's latency with every candidate loaded in one process, each configured as a mixed route opens it
    (`reconfigured`: the backends that open otherwise there, `Backend.mixed_options`), points interleaved; None when
    that could not be measured (`unmeasured` says why). A point missing from a backend's table is one it does not
    serve. `order`: the candidates, best first.

    The mixed route puts each point on its fastest backend in the mix, where a backend that runs the same way in
    both configurations (not in `reconfigured`) counts its slower figure of the two: one lucky timing must not win
    a shape; where the mix keeps the best single backend and it is not reconfigured, the two are one configuration
    and compare as 1. It is kept only when it is no more than NOISE slower than the best single backend at every named
    point (OTHER, the shapes without a point of their own, goes to the mix's fastest there: a named shape is one
    the user declared) and at least GAIN faster at one point; otherwise, and whenever the mix could not be
    measured, every shape goes to the best single backend.
    """
    singles = _single_candidates(alone, points, order)
    if together is None or not together:
        best = singles[0] if singles else next(b for b in order if b in alone)
        why = f"mixed route not measured ({unmeasured})" if unmeasured else "one candidate backend"
        return RouteChoice(dict.fromkeys(points, best), False, f"{best} alone: {why}", best)
    def in_mix(name: str, point: str) -> float:
        same = name not in reconfigured and point in alone.get(name, {})
        return max(together[name][point], alone[name][point]) if same else together[name][point]

    mix = {}
    for point in points:
        serving = [b for b in order if point in together.get(b, {})]
        if serving:
            mix[point] = min(serving, key=lambda b: (in_mix(b, point), order.index(b)))
    if not singles:
        missing = [p for p in points if p not in mix]
        if missing:
            raise ValueError(f"no candidate backend serves {missing}")
        return RouteChoice(mix, len(set(mix.values())) > 1, "mixed: no single backend serves every shape",
                           mix[points[0]])
    best = singles[0]
    if len(set(mix.values())) == 1 or len(mix) < len(points):
        return RouteChoice(dict.fromkeys(points, best), False, f"{best} alone: fastest at every shape", best)
    # where the mix keeps the single backend and runs it as alone, both figures time one configuration: 1 by
    # construction (compared, their noise alone rejected a mix: 1.09x at a shape the mix did not change)
    ratios = {p: 1.0 if mix[p] == best and best not in reconfigured else in_mix(mix[p], p) / alone[best][p]
              for p in points}
    worst = max([p for p in points if p != OTHER] or points, key=lambda p: ratios[p])
    gain = min(points, key=lambda p: ratios[p])
    table = ", ".join(f"{p} {ratios[p]:.2f}x" for p in points)
    if ratios[worst] <= 1 + NOISE and ratios[gain] <= 1 - GAIN:
        return RouteChoice(mix, True, f"mixed kept, vs {best} alone: {table}", best, ratios)
    why = f"{ratios[worst]:.2f}x at {worst}" if ratios[worst] > 1 + NOISE else f"under {GAIN:.0%} faster anywhere"
    return RouteChoice(dict.fromkeys(points, best), False, f"{best} alone: the mix was {why} ({table})", best,
                       ratios)


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
