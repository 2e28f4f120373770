"""Session.run checks inputs before any backend sees them: a ValueError naming the input and the range."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.manifest import InputProfile, NetworkRecord
from rlopt.runtime import check_feeds

PROFILES = {"input0": InputProfile(dtype="float32", min=[1, 1, 32], opt=[2, 3, 32], max=[4, 6, 32])}


@pytest.mark.parametrize(
    ("feeds", "needles"),
    [
        ({"obs": np.zeros((1, 1, 32), np.float32)}, ["unknown: ['obs']", "missing: ['input0']"]),
        ({"input0": np.zeros((1, 1, 32), np.float64)}, ["input0", "float32", "astype"]),
        ({"input0": np.zeros((1, 32), np.float32)}, ["input0", "rank 2", "rank 3"]),
        ({"input0": np.zeros((5, 1, 32), np.float32)}, ["input0", "dim 0 is 5", "[1, 4]"]),
        ({"input0": np.zeros((1, 1, 31), np.float32)}, ["dim 2 is 31", "[32, 32]"]),
        ({"input0": np.zeros((1, 1, 32), ">f4")}, ["big-endian"]),
        ({"input0": [[0.0] * 32]}, ["numpy array"]),
    ],
)
def test_bad_feeds_raise_value_error_naming_the_input(feeds: dict, needles: list[str]) -> None:
    with pytest.raises(ValueError) as info:
        check_feeds(feeds, PROFILES)
    for needle in needles:
        assert needle in str(info.value), (needle, str(info.value))


def test_non_contiguous_input_is_accepted_as_a_copy() -> None:
    x = np.zeros((2, 32, 3), np.float32).transpose(0, 2, 1)
    checked = check_feeds({"input0": x}, PROFILES)
    assert checked["input0"].flags.c_contiguous and checked["input0"].shape == (2, 3, 32)


def test_session_rejects_out_of_profile_shape_before_the_backend(tiny_compiled: Path) -> None:
    for backend in ("torchscript", "onnxruntime", "tvm"):
        session = rlopt.load(tiny_compiled, "policy", backend=backend)
        with pytest.raises(ValueError, match=r"dim 1 is 7, allowed \[1, 6\]"):
            session.run({"input0": np.zeros((1, 7, 32), np.float32)})
        assert session.run({"input0": np.zeros((4, 6, 32), np.float32)})["logits"].shape == (4, 6, 5)


def _record_with(latencies: dict[str, dict[str, float]], tvm_facts: dict) -> NetworkRecord:
    from rlopt.manifest import BackendRecord, FileRecord, Latency, NetworkRecord

    shapes = {"min": [1, 1, 32], "opt": [2, 3, 32], "max": [4, 6, 32]}
    artifacts = {}
    for backend, points in latencies.items():
        artifacts[backend] = BackendRecord(
            path=f"policy/{backend}", sha256="0" * 64, bytes=1, facts=tvm_facts if backend == "tvm" else {},
            latency_us={p: Latency(shape={"input0": shapes[p]}, p50=v, p99=v, iterations=10) for p, v in points.items()})
    return NetworkRecord(kind="policy", module="policy", inputs=PROFILES, outputs=["logits"], precision="fp32",
                         tolerance={}, reference=FileRecord(path="policy/reference.npz", sha256="0" * 64, bytes=1),
                         artifacts=artifacts)


def test_auto_routes_pick_per_shape_and_rank_other_shapes_by_the_path_that_serves_them() -> None:
    from rlopt.runtime import auto_routes

    latencies = {"onnxruntime": {"min": 20.0, "opt": 90.0, "max": 250.0},
                 "tvm": {"min": 25.0, "opt": 80.0, "max": 190.0}}
    bucketed = {"shape_builds": [{"shapes": {"input0": [2, 3, 32]}}], "variant_latency_us": {"dynamic": {"opt": 9000.0}}}
    plan = auto_routes(_record_with(latencies, bucketed), ["tvm", "onnxruntime"])
    assert plan.routes == {((1, 1, 32),): "onnxruntime", ((2, 3, 32),): "tvm", ((4, 6, 32),): "tvm"}
    assert plan.fallback == "onnxruntime", "TVM's untuned dynamic library serves other shapes: 9 ms is not 80 us"
    assert plan.onnxruntime_spinning is False, "ORT shares the process with TVM's pool: no spinning"
    unmeasured = {"shape_builds": [{"shapes": {"input0": [2, 3, 32]}}]}
    assert auto_routes(_record_with(latencies, unmeasured), ["tvm", "onnxruntime"]).fallback == "onnxruntime"
    alone = auto_routes(_record_with(latencies, {}), ["tvm", "onnxruntime"])
    assert alone.fallback == "tvm" and set(alone.routes.values()) == {"tvm", "onnxruntime"}
    only_ort = auto_routes(_record_with(latencies, bucketed), ["onnxruntime"])
    assert set(only_ort.routes.values()) == {"onnxruntime"} and only_ort.fallback == "onnxruntime"
    assert only_ort.onnxruntime_spinning is True, "ORT alone keeps its fastest setting"


def test_auto_reroutes_with_onnxruntime_latency_without_spinning_when_backends_mix() -> None:
    from rlopt.runtime import auto_routes

    latencies = {"onnxruntime": {"min": 20.0, "opt": 90.0, "max": 250.0},
                 "tvm": {"min": 25.0, "opt": 80.0, "max": 190.0}}
    record = _record_with(latencies, {})
    record.artifacts["onnxruntime"].facts["latency_without_spinning_us"] = {"min": 40.0, "opt": 120.0, "max": 300.0}
    plan = auto_routes(record, ["onnxruntime", "tvm"])
    assert set(plan.routes.values()) == {"tvm"} and plan.fallback == "tvm", "quiet ORT (40 us) loses min to TVM"
    assert plan.onnxruntime_spinning is True, "ORT is not loaded at all"


def test_auto_session_follows_the_manifest_routes_and_matches_the_reference(tiny_compiled: Path) -> None:
    import json

    manifest = json.loads((tiny_compiled / "manifest.json").read_text())
    expected_routes = manifest["networks"]["policy"]["facts"]["auto_routes"]
    session = rlopt.load(tiny_compiled, "policy")
    assert session.routes == expected_routes
    assert session.backend == expected_routes["2x3x32"]
    reference = rlopt.load(tiny_compiled, "policy", backend="torchscript")
    rng = np.random.default_rng(3)
    for shape in [(1, 1, 32), (2, 3, 32), (4, 6, 32), (3, 2, 32)]:
        x = rng.standard_normal(shape).astype(np.float32)
        for _ in range(2):  # the second call takes the remembered path
            np.testing.assert_allclose(session.run({"input0": x})["logits"], reference.run({"input0": x})["logits"],
                                       atol=1e-5, rtol=1e-4)


def test_remembered_shapes_still_reject_bad_inputs(tiny_compiled: Path) -> None:
    session = rlopt.load(tiny_compiled, "policy", backend="tvm")
    x = np.zeros((2, 3, 32), np.float32)
    session.run({"input0": x})
    session.run({"input0": x})
    with pytest.raises(ValueError, match="float32"):
        session.run({"input0": x.astype(np.float64)})
    with pytest.raises(ValueError, match="unknown"):
        session.run({"input0": x, "extra": x})
    with pytest.raises(ValueError, match="numpy array"):
        session.run({"input0": x.tolist()})
    strided = np.zeros((2, 32, 3), np.float32).transpose(0, 2, 1)
    assert session.run({"input0": strided})["logits"].shape == (2, 3, 5)


def test_auto_keeps_its_leader_unless_another_backend_is_clearly_faster() -> None:
    from rlopt.runtime import auto_routes

    close = {"onnxruntime": {"min": 23.0, "opt": 120.0, "max": 150.0}, "tvm": {"min": 25.0, "opt": 80.0, "max": 190.0}}
    plan = auto_routes(_record_with(close, {}), ["tvm", "onnxruntime"])
    assert plan.routes[((1, 1, 32),)] == "tvm", "23 vs 25 us is within timing noise: the leader (TVM) keeps it"
    assert plan.routes[((4, 6, 32),)] == "onnxruntime", "150 vs 190 us is a clear win"


def test_the_leader_is_the_best_backend_over_all_shapes_not_at_one() -> None:
    from rlopt.runtime import auto_routes

    # TVM is clearly faster at min and max; at opt ONNX Runtime timed 6% faster (one noisy compile-time timing)
    noisy_opt = {"onnxruntime": {"min": 18.0, "opt": 57.0, "max": 207.0},
                 "tvm": {"min": 13.0, "opt": 61.0, "max": 182.0}}
    plan = auto_routes(_record_with(noisy_opt, {}), ["onnxruntime", "tvm"])  # ORT first: it won at opt
    assert set(plan.routes.values()) == {"tvm"}, "TVM leads overall; 6% at opt is not a clear win for ORT"
    ort_ahead = {"onnxruntime": {"min": 23.0, "opt": 90.0, "max": 150.0},
                 "tvm": {"min": 25.0, "opt": 80.0, "max": 190.0}}
    plan = auto_routes(_record_with(ort_ahead, {}), ["tvm", "onnxruntime"])  # TVM first: it won at opt
    assert set(plan.routes.values()) == {"onnxruntime"}, "ORT leads overall (68 vs 72 us); 80 vs 90 us is within 15%"
