"""When a batch is worth padding: the manifest's latencies at the named shapes against an estimate for the rest.

A batch of `rows` stacked requests whose shape the profile does not name runs on the path for every other shape
(ONNX Runtime's dynamic shapes, TVM's padded or dynamic library). Compile timed each named shape (min, opt, max)
on the backend `auto` routes it to, and timed the other-shape path at opt (`unbucketed_p50`). The estimate for
`rows` interpolates the named latencies of the same other dims linearly in rows and scales them by how much slower
the other-shape path was at opt; padding up to the next named shape is chosen only when that shape's recorded
latency is below the estimate. A bucket is stacked at all only where that is faster than running its requests one
by one (`worth_stacking`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlopt.manifest import NetworkRecord, shape_label
from rlopt.runtime.routes import OTHER, unbucketed_p50

Dims = tuple[tuple[int, ...], ...]  # per input, the dims after dim 0: what a bucket of stackable requests shares


@dataclass(frozen=True)
class PaddingPlan:
    """Per bucket (other dims): the named rows with their recorded p50 (us) on the backend each is routed to, the
    same rows on the backend that serves every other shape (`other`), and the other-shape path's factor."""

    named: dict[Dims, list[tuple[int, float]]] = field(default_factory=dict)
    other_factor: float = 1.0
    other: dict[Dims, list[tuple[int, float]]] = field(default_factory=dict)
    _targets: dict[tuple[Dims, int], int] = field(default_factory=dict, compare=False, repr=False)

    def estimate_us(self, dims: Dims, rows: int) -> float | None:
        """The recorded latency at a named `rows`; else one interpolated from the latencies of the backend that
        serves the shapes without a name (the named route's where it has none there) times the other-shape factor."""
        points = self.named.get(dims)
        if not points:
            return None
        for named_rows, p50 in points:
            if named_rows == rows:
                return p50
        points = self.other.get(dims) or points
        xs = [r for r, _ in points]
        ys = [p for _, p in points]
        if rows > xs[-1] or rows < xs[0]:  # outside the named rows: the nearest one's cost per row
            near = -1 if rows > xs[-1] else 0
            return ys[near] * rows / xs[near] * self.other_factor
        return float(np.interp(rows, xs, ys)) * self.other_factor

    def worth_stacking(self, dims: Dims, rows: int) -> bool:
        """Whether `rows` one-row requests run faster stacked (padded where that pays) than one by one: a batch
        the profile does not name runs on the other-shape path, which can cost more than the named one-row route
        (the default policy: 4 rows on ONNX Runtime's dynamic shapes against 4 x TVM's 12 us)."""
        single = self.estimate_us(dims, 1)
        stacked = self.estimate_us(dims, self.target_rows(dims, rows))
        return single is None or stacked is None or rows < 2 or stacked < rows * single

    def target_rows(self, dims: Dims, rows: int) -> int:
        """The rows to run `rows` stacked rows as: the smallest named rows above when recorded faster, else `rows`.
        Kept per (bucket, rows): the batcher asks on every run, and the plan never changes."""
        if (dims, rows) not in self._targets:
            self._targets[(dims, rows)] = self._target_rows(dims, rows)
        return self._targets[(dims, rows)]

    def _target_rows(self, dims: Dims, rows: int) -> int:
        points = self.named.get(dims, [])
        above = [(r, p50) for r, p50 in points if r >= rows]
        if not above or above[0][0] == rows:
            return rows
        estimate = self.estimate_us(dims, rows)
        named_rows, p50 = above[0]
        return named_rows if estimate is not None and p50 < estimate else rows


def padding_plan(record: NetworkRecord | None, routes: dict[str, str]) -> PaddingPlan:
    """The plan from a network's manifest record and its session's routes (label -> backend, 'other' included)."""
    if record is None:
        return PaddingPlan()
    names = list(record.inputs)
    named: dict[Dims, dict[int, float]] = {}
    on_fallback: dict[Dims, dict[int, float]] = {}
    fallback_backend = routes.get(OTHER, "")
    fallback = record.artifacts.get(fallback_backend)
    for point in ("min", "opt", "max"):
        shapes = [tuple(getattr(record.inputs[n], point)) for n in names]
        if any(len(s) == 0 for s in shapes) or len({s[0] for s in shapes}) != 1:
            continue
        backend = routes.get(shape_label(shapes), routes.get(OTHER))
        artifact = record.artifacts.get(backend) if backend else None
        latency = artifact.latency_us.get(point) if artifact is not None else None
        if latency is None:
            continue
        dims = tuple(s[1:] for s in shapes)
        named.setdefault(dims, {})[shapes[0][0]] = latency.p50
        on_other = fallback.latency_us.get(point) if fallback is not None else None
        if on_other is not None:
            on_fallback.setdefault(dims, {})[shapes[0][0]] = on_other.p50
    factor = 1.0
    if fallback is not None and fallback.latency_us.get("opt") is not None:
        other = unbucketed_p50(fallback_backend, fallback)
        tuned = fallback.latency_us["opt"].p50
        factor = max(1.0, other / tuned) if np.isfinite(other) and tuned > 0 else 1.0
    return PaddingPlan({dims: sorted(points.items()) for dims, points in named.items()}, factor,
                       {dims: sorted(points.items()) for dims, points in on_fallback.items()})


def plan_for(session: Any) -> PaddingPlan:
    """The plan for a Session (its `record` and `routes`); an object without them never pads."""
    record = getattr(session, "record", None)
    routes = getattr(session, "routes", None)
    return padding_plan(record, dict(routes)) if isinstance(record, NetworkRecord) and routes else PaddingPlan()


__all__ = ["Dims", "PaddingPlan", "padding_plan", "plan_for"]
