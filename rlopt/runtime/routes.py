"""`auto`: which verified backend serves which shape, from the latencies compile measured (reads only the manifest)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from rlopt.backends.onnxruntime.facts import OnnxRuntimeFacts
from rlopt.backends.tvm.facts import TvmFacts
from rlopt.backends.tvm.padding import padding_plan
from rlopt.facts import ArtifactFacts
from rlopt.manifest import BackendRecord, NetworkRecord
from rlopt.runtime.session import ShapeKey

SWITCH_MARGIN = 0.85  # another backend takes a shape from auto's leader only when at least 15% faster there


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


def unbucketed_variant(facts: ArtifactFacts | Mapping[str, Any]) -> str | None:
    """The path of an artifact with per-shape builds (TVM) that serves every other shape: 'padded' once the parity
    gate passed it and every shape in [min, max] pads into some build, else 'dynamic'; None without such builds."""
    typed = TvmFacts.of(facts)
    builds = typed.shape_builds
    if not builds:
        return None
    plan = padding_plan(builds, list(builds[0].shapes))
    return "padded" if typed.gate_passed("padded") and plan is not None and plan.covers_range else "dynamic"


def unbucketed_p50(artifact: BackendRecord) -> float:
    """Latency at the opt shape through the code path that serves shapes without their own build.

    TVM serves profile shapes from tuned per-shape libraries and every other shape from its dynamic library, or,
    once the parity gate passed padding and every shape pads into some build, from a bigger build padded with
    zeros; compile times each path separately (`facts.variant_latency_us`); unmeasured = never picked.
    """
    facts = TvmFacts.of(artifact.facts)
    variant = unbucketed_variant(facts)
    if variant is not None:
        value = facts.variant_latency_us.get(variant, {}).get("opt")
        return float(value) if value else float("inf")
    latency = artifact.latency_us.get("opt")
    return latency.p50 if latency else float("inf")


@dataclass(frozen=True)
class AutoPlan:
    """What `auto` loads: a backend per measured shape, one for every other shape, and whether ONNX Runtime may
    spin (only when it is the session's only backend: its spinning pool starves another backend's threads)."""

    routes: dict[ShapeKey, str]
    fallback: str
    onnxruntime_spinning: bool


def _best_routes(record: NetworkRecord, usable: list[str], quiet_ort: bool) -> tuple[dict[ShapeKey, str], str]:
    ort = record.artifacts.get("onnxruntime")
    quiet = OnnxRuntimeFacts.of(ort.facts).latency_without_spinning_us if quiet_ort and ort else {}

    def p50(name: str, point: str) -> float:
        if name == "onnxruntime" and point in quiet:
            return float(quiet[point])
        return record.artifacts[name].latency_us[point].p50

    points = list(dict.fromkeys(p for name in usable for p in record.artifacts[name].latency_us))
    everywhere = [p for p in points if all(p in record.artifacts[name].latency_us for name in usable)]

    def overall(name: str) -> float:
        """Geometric mean p50 over the shapes every usable backend was timed at (scale-free across shapes)."""
        return float(np.exp(np.mean([np.log(max(p50(name, p), 1e-9)) for p in everywhere])))

    # the leader is the best backend over the whole profile: one shape's short compile-time timing (opt's, say,
    # hit by a descheduled thread) must not hand every close shape to another backend
    leader = min(usable, key=lambda name: (overall(name), usable.index(name))) if everywhere else usable[0]

    def pick(candidates: list[str], cost: Callable[[str], float]) -> str:
        """The fastest, but the leader keeps a shape unless another backend is clearly faster: compile-time
        timings are short, and every extra backend in a session costs (see AutoPlan)."""
        best = min(candidates, key=lambda name: (cost(name), usable.index(name)))
        if leader in candidates and best != leader and not cost(best) < SWITCH_MARGIN * cost(leader):
            return leader
        return best

    routes: dict[ShapeKey, str] = {}
    for point in points:
        measured = [name for name in usable if point in record.artifacts[name].latency_us]
        if measured:
            best = pick(measured, lambda name: p50(name, point))
            shape = record.artifacts[best].latency_us[point].shape
            routes.setdefault(tuple(tuple(int(d) for d in shape[n]) for n in record.inputs), best)
    timed = {name: unbucketed_p50(record.artifacts[name]) for name in usable}
    if "onnxruntime" in timed and "opt" in quiet:
        timed["onnxruntime"] = float(quiet["opt"])
    fallback = pick(usable, lambda name: timed[name])
    if timed[fallback] == float("inf"):
        fallback = usable[0]
    return routes, fallback


def auto_routes(record: NetworkRecord, usable: list[str]) -> AutoPlan:
    """`auto`: per measured shape the usable backend with the lowest p50 there, for other shapes the lowest
    `unbucketed_p50`; a backend takes a shape from the leader (lowest geometric-mean p50 over the shapes) only when
    more than 15% faster there. Only verified backends that can run here (`usable`, best first) count. When that
    mixes ONNX Runtime with another backend, ORT runs without spinning and the routes are re-chosen with its latency
    so."""
    routes, fallback = _best_routes(record, usable, quiet_ort=False)
    chosen = set(routes.values()) | {fallback}
    if "onnxruntime" in chosen and len(chosen) > 1:
        routes, fallback = _best_routes(record, usable, quiet_ort=True)
        chosen = set(routes.values()) | {fallback}
    return AutoPlan(routes, fallback, onnxruntime_spinning=chosen == {"onnxruntime"} or "onnxruntime" not in chosen)


__all__ = ["SWITCH_MARGIN", "AutoPlan", "auto_routes", "ranked_backends", "unbucketed_p50", "unbucketed_variant"]
