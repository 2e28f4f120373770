"""rlopt.tools.diff.compare: the comparison of two MODEL_DIRs from data (timings injected, no clock)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlopt.facts import ArtifactFacts, RoutePlan
from rlopt.manifest import BackendRecord, NetworkRecord, read_manifest
from rlopt.tools.diff.compare import (
    NEW,
    NEW_TWIN,
    OLD,
    OLD_TWIN,
    NetworkTiming,
    backend_changes,
    backend_status,
    compare_network,
    file_changes,
    is_latency_regression,
    latency_figures,
    network_files,
    route_at,
    route_changes,
)
from rlopt.tools.diff.schema import DriftResult, Thresholds
from tests.tools.diff_common import rounds_of


@pytest.fixture(scope="module")
def policy(ort_compiled: Path) -> NetworkRecord:
    """The tiny ONNX Runtime MODEL_DIR's policy record; tests change copies of it."""
    return read_manifest(ort_compiled).networks["policy"]


def shapes_of(record: NetworkRecord) -> dict[str, dict[str, list[int]]]:
    return {point: {name: getattr(profile, point) for name, profile in record.inputs.items()}
            for point in ("min", "opt", "max")}


def test_latency_figures_pair_rounds_and_take_the_faster_copy_of_each_side() -> None:
    rounds = {OLD: [100, 100, 100, 100], OLD_TWIN: [300, 102, 100, 104],   # a stall hits one copy in round 0
              NEW: [130, 400, 130, 130], NEW_TWIN: [131, 129, 130, 132]}
    figures = latency_figures(rounds)
    assert figures is not None
    assert figures.old_us == 100 and figures.new_us == 130 and figures.rounds == 4
    assert figures.ratio == pytest.approx(1.30)
    # A/A: old twin / old per round is 3.0, 1.02, 1.0, 1.04 (median 1.03); new 131/130, 129/400, 1, 132/130
    assert figures.aa_noise == pytest.approx(1.03, abs=1e-3)


def test_latency_figures_need_both_sides_and_use_a_lone_copy() -> None:
    assert latency_figures({OLD: [100.0], OLD_TWIN: [100.0]}) is None
    lone = latency_figures({OLD: [100.0, 100.0], NEW: [150.0, 160.0]})
    assert lone is not None and lone.ratio == pytest.approx(1.55) and lone.aa_noise == 1.0


@pytest.mark.parametrize(("ratio", "noise", "limit", "regression"), [
    (1.20, 1.02, 1.10, True), (1.20, 1.30, 1.10, False), (1.08, 1.00, 1.10, False), (1.10, 1.00, 1.10, False),
    (1.11, 1.00, 1.10, True)])
def test_a_slowdown_must_exceed_the_threshold_and_the_aa_noise(ratio: float, noise: float, limit: float,
                                                              regression: bool) -> None:
    assert is_latency_regression(ratio, noise, limit) is regression


def test_backend_status_names_every_state(policy: NetworkRecord) -> None:
    verified = policy.artifacts["onnxruntime"]
    failed = verified.model_copy(deep=True)
    assert failed.parity is not None
    failed.parity.passed = False
    unverified = verified.model_copy(update={"facts": verified.facts.updated(verified=False)})
    assert [backend_status(r) for r in (verified, failed, unverified, BackendRecord(skipped="no GPU"), None)] == [
        "verified", "failed parity", "built, not verified here", "skipped: no GPU", None]


def with_artifacts(record: NetworkRecord, **artifacts: BackendRecord | None) -> NetworkRecord:
    changed = record.model_copy(deep=True)
    for name, artifact in artifacts.items():
        if artifact is None:
            changed.artifacts.pop(name, None)
        else:
            changed.artifacts[name] = artifact
    return changed


def test_backend_changes_and_file_changes(policy: NetworkRecord) -> None:
    ort = policy.artifacts["onnxruntime"]
    rebuilt = ort.model_copy(update={"sha256": "0" * 64})
    old = with_artifacts(policy, torchscript=ort.model_copy(update={"path": "policy/old-only.bin", "sha256": "1" * 64,
                                                                   "facts": ArtifactFacts()}))
    new = with_artifacts(policy, onnxruntime=rebuilt, tensorrt=BackendRecord(skipped="no GPU"))
    changes = {c.name: c for c in backend_changes(old, new)}
    assert (changes["torchscript"].old, changes["torchscript"].new) == ("verified", None)
    assert changes["onnxruntime"].same_bytes is False and not changes["onnxruntime"].changed
    assert (changes["tensorrt"].old, changes["tensorrt"].new) == (None, "skipped: no GPU")
    files = file_changes(network_files(old), network_files(new))
    assert files.dropped == ["policy/old-only.bin"] and files.changed == [ort.path] and files.added == []
    assert files.same == len(network_files(new)) - 1


def test_routes_by_shape_label_with_onnxruntime_threads_and_changes(policy: NetworkRecord) -> None:
    new = policy.model_copy(deep=True)
    routes = {"1x1x32": "tvm", "2x3x32": "onnxruntime", "other": "onnxruntime"}
    ort_options = {"intra_op_threads": 1, "shape_threads": {"4x6x32": 0}}
    new.facts = new.facts.updated(route=RoutePlan(routes=routes, options={"onnxruntime": ort_options}))
    new.selected = "tvm"
    assert route_at(new, {"input0": [1, 1, 32]}) == "tvm"
    assert route_at(new, {"input0": [2, 3, 32]}) == "onnxruntime (1 thread)"
    assert route_at(new, {"input0": [4, 6, 32]}) == "onnxruntime (pool)"  # no route of its own: `other`'s backend
    new.facts = new.facts.updated(route=RoutePlan(routes=routes, options={
        "onnxruntime": {**ort_options, "allow_spinning": False}}))
    assert route_at(new, {"input0": [2, 2, 32]}) == "onnxruntime (1 thread, not spinning)"
    old = policy.model_copy(deep=True)
    old.facts = old.facts.updated(route=RoutePlan(routes={label: "onnxruntime" for label in routes}))
    changed = {c.name: (c.old, c.new) for c in route_changes(old, new) if c.changed}
    assert changed == {"selected": ("onnxruntime", "tvm"), "1x1x32": ("onnxruntime (pool)", "tvm"),
                       "2x3x32": ("onnxruntime (pool)", "onnxruntime (1 thread, not spinning)"),
                       "other": ("onnxruntime (pool)", "onnxruntime (1 thread, not spinning)")}


def thresholds(**given: object) -> Thresholds:
    return Thresholds(**given)  # type: ignore[arg-type]


def drift_of(kl: float) -> DriftResult:
    return DriftResult(metric="kl", value=kl, kl_mean=kl, kl_max=kl * 3, argmax_agree=0.9, max_abs=0.1, max_rel=0.1,
                       relative_error=0.05, compared=12)


def test_compare_network_lines_name_network_shape_and_figure(policy: NetworkRecord) -> None:
    shapes = shapes_of(policy)
    timing = NetworkTiming(rounds={"min": rounds_of(100, 101), "opt": rounds_of(100, 150), "max": rounds_of(100, 99)})
    result = compare_network("policy", policy, policy, shapes, timing, drift_of(0.02), thresholds(max_drift_kl=0.01))
    assert list(result.regressions) == ["latency", "drift"]
    (slower,) = result.regressions["latency"]
    assert slower.startswith("policy: opt 2x3x32: latency 1.50x") and "max_latency_ratio 1.1" in slower
    assert [row.regression for row in result.latency] == [False, True, False]
    assert result.regressions["drift"] == ["policy: drift KL(old || new) mean 0.02 > max_drift_kl 0.01, "
                                           "argmax agreement 0.900"]
    quiet = compare_network("policy", policy, policy, shapes, timing, drift_of(0.02), thresholds(max_latency_ratio=2))
    assert quiet.regressions == {} and quiet.drift is not None and not quiet.drift.regression  # drift: reported


def test_dropped_and_failed_backends(policy: NetworkRecord) -> None:
    ort = policy.artifacts["onnxruntime"]
    old = with_artifacts(policy, torchscript=ort.model_copy(update={"path": "policy/model.ts", "facts": ArtifactFacts()}))
    failed = ort.model_copy(deep=True)
    assert failed.parity is not None
    failed.parity.passed, failed.parity.max_abs = False, 0.5
    new = with_artifacts(policy, onnxruntime=failed, torchscript=BackendRecord(skipped="not requested"))
    timing = NetworkTiming(rounds={p: rounds_of(100, 100) for p in ("min", "opt", "max")})
    result = compare_network("policy", old, new, shapes_of(policy), timing, None, thresholds())
    assert result.regressions["backends"] == [
        "policy: backend torchscript dropped: built in OLD_DIR, skipped: not requested in NEW_DIR (allowed only with "
        "ci.allow_dropped_backends: true)"]
    assert result.regressions["parity"] == ["policy: backend onnxruntime failed parity at compile time in NEW_DIR "
                                            "(max_abs 0.5)"]
    allowed = compare_network("policy", old, new, shapes_of(policy), timing, None,
                              thresholds(allow_dropped_backends=True))
    assert "backends" not in allowed.regressions and "parity" in allowed.regressions


def test_a_side_that_could_not_be_timed(policy: NetworkRecord) -> None:
    shapes = shapes_of(policy)
    old_gone = NetworkTiming(rounds={p: {NEW: [100.0], NEW_TWIN: [100.0]} for p in shapes},
                             failures={OLD: "cannot be loaded: x", OLD_TWIN: "cannot be loaded: x"})
    result = compare_network("policy", policy, policy, shapes, old_gone, None, thresholds())
    assert result.regressions == {} and all(row.note.startswith("not timed: old: cannot be loaded")
                                            for row in result.latency)
    new_gone = NetworkTiming(rounds={}, failures={NEW: "worker exited with code -9 (SIGKILL)"})
    lines = compare_network("policy", policy, policy, shapes, new_gone, None, thresholds()).regressions["latency"]
    assert len(lines) == 3 and lines[0].startswith("policy: min 1x1x32: NEW_DIR's selected route could not be timed")
