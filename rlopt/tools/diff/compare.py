"""The comparison itself, pure: two manifests, the timings and the drift as data -> one NetworkDiff per network.

Latency. Per named shape, each MODEL_DIR's selected route runs in two worker processes of its own (a copy and its
A/A twin), all four interleaved round by round (rlopt.tools.diff.latency). A side's figure in a round is the lower
of its two copies' block medians (a stall hits one block, not both); `ratio` is the median over rounds of new / old
in the same round, so drift that hits a whole round cancels. `aa_noise` is how far the copies of one MODEL_DIR read
apart (the bench protocol's max(A/A, 1 / A/A), the larger of the two sides). A shape regresses only when its ratio
exceeds both `max_latency_ratio` and that noise: a slowdown no larger than what two identical builds show on this
machine right now is not evidence. A shape that reads as a regression is timed once more (new worker processes,
another seed) and stays one only when it regresses there too: a burst of load on a shared runner then fails a
build only when it lasts through both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from rlopt.backends import facts_of
from rlopt.manifest import BackendRecord, Manifest, NetworkRecord, shape_label
from rlopt.runtime.routes import OTHER
from rlopt.tools.bench.protocol import aa_noise, paired_ratio
from rlopt.tools.diff.schema import Change, DriftResult, FileChanges, NetworkDiff, ShapeLatency, Thresholds

OLD, OLD_TWIN, NEW, NEW_TWIN = "old", "old (A/A)", "new", "new (A/A)"


@dataclass
class NetworkTiming:
    """What the timer measured for one network: per point, each copy's per-round block medians (us)."""

    rounds: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # point -> copy -> per-round medians
    failures: dict[str, str] = field(default_factory=dict)  # copy -> why it stopped (it has no rounds after)


@dataclass(frozen=True)
class LatencyFigures:
    old_us: float
    new_us: float
    ratio: float
    aa_noise: float
    rounds: int


def _side(rounds: Mapping[str, Sequence[float]], name: str, twin: str) -> np.ndarray | None:
    """Per round, the lower of a MODEL_DIR's two copies (one copy alone when its twin has no rounds)."""
    copies = [np.asarray(rounds[n], float) for n in (name, twin) if len(rounds.get(n, ()))]
    if not copies:
        return None
    count = min(len(c) for c in copies)
    return np.min([c[:count] for c in copies], axis=0)


def latency_figures(rounds: Mapping[str, Sequence[float]]) -> LatencyFigures | None:
    """The figures of one shape from its per-round medians (see the module docstring); None without both sides."""
    old, new = _side(rounds, OLD, OLD_TWIN), _side(rounds, NEW, NEW_TWIN)
    if old is None or new is None:
        return None
    count = min(len(old), len(new))
    noise = [aa_noise(paired_ratio(rounds[twin], rounds[name])) for name, twin in ((OLD, OLD_TWIN), (NEW, NEW_TWIN))
             if len(rounds.get(name, ())) and len(rounds.get(twin, ()))]
    return LatencyFigures(old_us=round(float(np.median(old)), 3), new_us=round(float(np.median(new)), 3),
                          ratio=round(paired_ratio(new[:count], old[:count]), 4),
                          aa_noise=round(max(noise), 4) if noise else 1.0, rounds=count)


def is_latency_regression(ratio: float, noise: float, max_ratio: float) -> bool:
    return ratio > max_ratio and ratio > noise


def route(record: NetworkRecord, label: str) -> str:
    """What `auto` runs at a shape label (or `other`), as the manifest records it: the backend, and how its route
    opens it there (its facts' `route_detail`: ONNX Runtime's threads and spinning). A label without a route of its
    own runs the `other` route; a MODEL_DIR without routes runs `selected`."""
    plan = record.facts.route
    routes = plan.routes if plan is not None else {}
    backend = routes.get(label, routes.get(OTHER, record.selected))
    artifact = record.artifacts.get(backend) if backend is not None else None
    if artifact is None:
        return str(backend)
    options = plan.options.get(str(backend), {}) if plan is not None else {}
    detail = facts_of(str(backend), artifact.facts).updated(**options).route_detail(label)
    return f"{backend} ({detail})" if detail else str(backend)


def route_at(record: NetworkRecord, shape: Mapping[str, Sequence[int]]) -> str:
    return route(record, shape_label(shape.values()))


def backend_status(record: BackendRecord | None) -> str | None:
    """'verified', 'built, not verified here', 'failed parity', 'skipped: <reason>', or None when absent."""
    if record is None:
        return None
    if not record.built:
        return f"skipped: {record.skipped}"
    if record.facts.verified is False:
        return "built, not verified here"
    return "verified" if record.verified else "failed parity"


def _built(record: BackendRecord | None) -> bool:
    return record is not None and record.built


def backend_changes(old: NetworkRecord, new: NetworkRecord) -> list[Change]:
    names = list(dict.fromkeys([*old.artifacts, *new.artifacts]))
    changes = []
    for name in names:
        before, after = old.artifacts.get(name), new.artifacts.get(name)
        same = before.sha256 == after.sha256 if _built(before) and _built(after) else None  # type: ignore[union-attr]
        changes.append(Change(name=name, old=backend_status(before), new=backend_status(after), same_bytes=same))
    return changes


def route_changes(old: NetworkRecord, new: NetworkRecord) -> list[Change]:
    """Every `auto` route of either MODEL_DIR (shape label -> what runs there), and the selected backend."""
    before, after = (dict(r.facts.route.routes) if r.facts.route is not None else {} for r in (old, new))
    labels = list(dict.fromkeys([*before, *after]))
    return ([Change(name="selected", old=old.selected, new=new.selected)]
            + [Change(name=label, old=route(old, label) if label in before else None,
                      new=route(new, label) if label in after else None) for label in labels])


def network_files(record: NetworkRecord) -> dict[str, str]:
    """Every file a network lists (reference, files, artifacts and the files that load with them): path -> sha256."""
    found = {record.reference.path: record.reference.sha256}
    found.update({f.path: f.sha256 for f in record.files.values()})
    for backend, artifact in record.artifacts.items():
        if artifact.built and artifact.path and artifact.sha256:
            found[artifact.path] = artifact.sha256
            found.update({f.path: f.sha256 for f in facts_of(backend, artifact.facts).companion_files()})
    return found


def manifest_files(manifest: Manifest) -> dict[str, str]:
    """The files outside the networks (recipe.yaml): path -> sha256."""
    return {manifest.recipe.path: manifest.recipe.sha256}


def file_changes(old: Mapping[str, str], new: Mapping[str, str]) -> FileChanges:
    return FileChanges(added=sorted(set(new) - set(old)), dropped=sorted(set(old) - set(new)),
                       changed=sorted(p for p in set(old) & set(new) if old[p] != new[p]),
                       same=sum(1 for p in set(old) & set(new) if old[p] == new[p]))


def _latency(name: str, old: NetworkRecord, new: NetworkRecord, shapes: Mapping[str, dict[str, list[int]]],
             timing: NetworkTiming, confirm: NetworkTiming | None, max_ratio: float
             ) -> tuple[list[ShapeLatency], list[str]]:
    rows, regressions = [], []
    for point, shape in shapes.items():
        label = f"{point} {shape_label(shape.values())}"
        row = ShapeLatency(point=point, shape=shape, old_route=route_at(old, shape), new_route=route_at(new, shape))
        rounds = timing.rounds.get(point, {})
        figures = latency_figures(rounds)
        if figures is None:
            why = "; ".join(f"{copy}: {reason}" for copy, reason in timing.failures.items()) or "no rounds"
            row.note = f"not timed: {why}"
            if not any(len(rounds.get(copy, ())) for copy in (NEW, NEW_TWIN)):
                row.regression = True
                regressions.append(f"{name}: {label}: NEW_DIR's selected route could not be timed ({why})")
            rows.append(row)
            continue
        row.old_us, row.new_us, row.ratio = figures.old_us, figures.new_us, figures.ratio
        row.aa_noise, row.rounds = figures.aa_noise, figures.rounds
        row.regression = is_latency_regression(figures.ratio, figures.aa_noise, max_ratio)
        again = latency_figures(confirm.rounds.get(point, {})) if confirm is not None and row.regression else None
        if again is not None:
            row.confirm_ratio, row.confirm_aa_noise = again.ratio, again.aa_noise
            row.regression = is_latency_regression(again.ratio, again.aa_noise, max_ratio)
        if row.regression:
            route = row.new_route if row.old_route == row.new_route else f"{row.old_route} -> {row.new_route}"
            confirmed = "" if again is None else f"; timed again: {again.ratio:.2f}x, A/A noise {again.aa_noise:.2f}"
            regressions.append(f"{name}: {label}: latency {figures.ratio:.2f}x OLD_DIR's ({figures.old_us:.1f} us -> "
                               f"{figures.new_us:.1f} us, route {route}) > max_latency_ratio {max_ratio:g} and A/A "
                               f"noise {figures.aa_noise:.2f}{confirmed}")
        rows.append(row)
    return rows, regressions


def suspects(diff: NetworkDiff) -> list[str]:
    """The points whose first timing reads as a regression: `compare_network` wants them timed again (`confirm`)."""
    return [row.point for row in diff.latency if row.regression and row.ratio is not None]


def _backend_regressions(name: str, changes: list[Change], old: NetworkRecord, new: NetworkRecord,
                         allow_dropped: bool) -> tuple[list[str], list[str]]:
    """(dropped backends, parity failures in NEW_DIR) as regression lines."""
    dropped, parity = [], []
    for change in changes:
        if _built(old.artifacts.get(change.name)) and not _built(new.artifacts.get(change.name)) and not allow_dropped:
            dropped.append(f"{name}: backend {change.name} dropped: built in OLD_DIR, "
                           f"{change.new or 'not in the recipe'} in NEW_DIR (allowed only with "
                           "ci.allow_dropped_backends: true)")
        if change.new == "failed parity":
            record = new.artifacts[change.name]
            detail = f" (max_abs {record.parity.max_abs:.3g})" if record.parity else ""
            parity.append(f"{name}: backend {change.name} failed parity at compile time in NEW_DIR{detail}")
    return dropped, parity


def compare_network(name: str, old: NetworkRecord, new: NetworkRecord, shapes: Mapping[str, dict[str, list[int]]],
                    timing: NetworkTiming, drift: DriftResult | None, thresholds: Thresholds,
                    confirm: NetworkTiming | None = None) -> NetworkDiff:
    """One network present in both MODEL_DIRs (same inputs and outputs: checked before). `confirm`: a second timing
    of the `suspects`; a shape stays a regression only when it regresses there too."""
    latency, slower = _latency(name, old, new, shapes, timing, confirm, thresholds.max_latency_ratio)
    backends = backend_changes(old, new)
    dropped, parity = _backend_regressions(name, backends, old, new, thresholds.allow_dropped_backends)
    drifted = []
    if drift is not None and drift.metric == "kl" and thresholds.max_drift_kl is not None \
            and drift.value > thresholds.max_drift_kl:
        drift.regression = True
        agree = f", argmax agreement {drift.argmax_agree:.3f}" if drift.argmax_agree is not None else ""
        drifted.append(f"{name}: drift KL(old || new) mean {drift.value:.3g} > max_drift_kl "
                       f"{thresholds.max_drift_kl:g}{agree}")
    old_triton = old.facts.triton
    new_triton = new.facts.triton
    return NetworkDiff(network=name, kind=new.kind, latency=latency, routes=route_changes(old, new), backends=backends,
                       files=file_changes(network_files(old), network_files(new)),
                       triton_models=file_changes(dict.fromkeys(old_triton, ""), dict.fromkeys(new_triton, "")),
                       drift=drift, regressions={check: lines for check, lines in
                                                 (("parity", parity), ("latency", slower), ("drift", drifted),
                                                  ("backends", dropped)) if lines})


def one_sided(name: str, record: NetworkRecord, status: str) -> NetworkDiff:
    """A network in only one MODEL_DIR: added (reported) or dropped (a regression)."""
    regressions = {"network": [f"{name}: network dropped: in OLD_DIR, not in NEW_DIR"]} if status == "dropped" else {}
    return NetworkDiff(network=name, kind=record.kind, status=status, regressions=regressions)  # type: ignore[arg-type]


__all__ = ["NEW", "NEW_TWIN", "OLD", "OLD_TWIN", "LatencyFigures", "NetworkTiming", "backend_changes",
           "backend_status", "compare_network", "file_changes", "is_latency_regression", "latency_figures",
           "manifest_files", "network_files", "one_sided", "route", "route_at", "route_changes", "suspects"]
