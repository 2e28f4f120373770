"""Call-sequence tests of the TensorRT adapter and runner against a recording stand-in (tests/tensorrt_standin.py).

These check which TensorRT API calls rlopt makes, in which order and with which values, for
TensorRT 10 and 11. They build no engine: real builds are the `gpu`-marked tests at the end,
which run only where an NVIDIA GPU and TensorRT are present.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlopt.errors import ArtifactError, BackendUnavailable, StageError
from rlopt.backends.tensorrt.config import TensorRTConfig
from rlopt.recipe import InputSpec, NetworkSpec, ProfileRange
from rlopt.backends.tensorrt.runner import TensorRTRunner
from rlopt.backends.tensorrt.adapter import TensorRTAdapter
from rlopt.backends.tensorrt.plan import make_plan
from tests.tensorrt_standin import make_cpu_torch, make_tensorrt


def mlp_model(hidden: int = 8) -> object:
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array(rng.standard_normal((4, hidden)).astype(np.float32), "w1")
    w2 = numpy_helper.from_array(rng.standard_normal((hidden, 6)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "w1"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
         helper.make_node("MatMul", ["r", "w2"], ["logits"])],
        "mlp", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 6])], [w1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def plan_for(precision: str = "fp16", *, extra_profile: bool = False, timing_cache: str | None = None,
             budget: float = 60.0, refit: bool = True, tmp: Path = Path(".")):
    inputs = {"obs": InputSpec(min=[1, 4], opt=[4, 4], max=[8, 4])}
    profiles = [{"obs": ProfileRange(min=[1, 4], opt=[1, 4], max=[2, 4])}] if extra_profile else []
    spec = NetworkSpec(inputs=inputs, outputs=["logits"], precision=precision, profiles=profiles)
    config = TensorRTConfig(workspace_mb=256, refittable=refit, builder_optimization_level=4,
                            timing_cache=timing_cache, build_timeout_s=budget)
    return make_plan(spec, config, mlp_model(), recipe_path=tmp / "recipe.yaml", network="policy")


def methods(trt) -> list[str]:
    return [f"{owner}.{method}" for owner, method, _ in trt.calls]


def calls_of(trt, name: str) -> list[tuple]:
    return [args for owner, method, args in trt.calls if f"{owner}.{method}" == name]


def build(trt, plan, tmp: Path, lines: list[str] | None = None):
    onnx_path = tmp / "model.onnx"
    onnx_path.write_bytes(b"onnx")
    adapter = TensorRTAdapter(trt, progress=(lines.append if lines is not None else lambda _: None))
    return adapter, adapter.build(onnx_path, plan, tmp / "model.plan")


def test_tensorrt_10_call_sequence_uses_builder_flags_for_fp16(tmp_path: Path) -> None:
    trt = make_tensorrt("10.13.3")
    adapter, result = build(trt, plan_for("fp16", tmp=tmp_path), tmp_path)
    assert methods(trt)[:4] == ["Logger.__init__", "Builder.__init__", "Builder.create_network",
                                "OnnxParser.__init__"]
    assert calls_of(trt, "Builder.create_network") == [(0,)]
    assert calls_of(trt, "IBuilderConfig.set_flag") == [("REFIT",), ("FP16",)]
    assert calls_of(trt, "IBuilderConfig.set_memory_pool_limit") == [("WORKSPACE", 256 << 20)]
    assert calls_of(trt, "IBuilderConfig.builder_optimization_level=") == [(4,)]
    assert calls_of(trt, "IOptimizationProfile.set_shape") == [("obs", (1, 4), (4, 4), (8, 4))]
    order = methods(trt)
    assert order.index("IBuilderConfig.add_optimization_profile") < order.index("Builder.build_serialized_network")
    assert order.index("IBuilderConfig.progress_monitor=") < order.index("Builder.build_serialized_network")
    assert (tmp_path / "model.plan").read_bytes() == b"ENGINE-BYTES"
    assert result.engine_bytes == len(b"ENGINE-BYTES")
    assert result.facts["typing"].startswith("weak") and result.facts["precision_built"] == "fp16"
    assert adapter.graph_casts_for("fp16") is None


def test_tensorrt_11_call_sequence_has_no_precision_flags_and_wants_graph_casts(tmp_path: Path) -> None:
    trt = make_tensorrt("11.4.0")
    assert not hasattr(trt.BuilderFlag, "FP16")
    adapter, result = build(trt, plan_for("fp16", tmp=tmp_path), tmp_path)
    assert calls_of(trt, "IBuilderConfig.set_flag") == [("REFIT",)]
    assert calls_of(trt, "Builder.create_network") == [(0,)]
    assert adapter.graph_casts_for("fp16") == "fp16"
    assert adapter.graph_casts_for("fp32") is None
    assert result.facts["typing"].startswith("strong")


@pytest.mark.parametrize("version", ["10.13.3", "11.4.0"])
def test_one_optimization_profile_per_plan_profile(version: str, tmp_path: Path) -> None:
    trt = make_tensorrt(version)
    build(trt, plan_for("fp32", extra_profile=True, refit=False, tmp=tmp_path), tmp_path)
    assert calls_of(trt, "IOptimizationProfile.set_shape") == [("obs", (1, 4), (4, 4), (8, 4)),
                                                                ("obs", (1, 4), (1, 4), (2, 4))]
    assert len(calls_of(trt, "IBuilderConfig.add_optimization_profile")) == 2
    assert calls_of(trt, "IBuilderConfig.set_flag") == []


@pytest.mark.parametrize("version", ["10.13.3", "11.4.0"])
def test_int8_and_unsupported_bf16_build_fp32_with_a_notice(version: str, tmp_path: Path) -> None:
    trt = make_tensorrt(version)
    adapter, result = build(trt, plan_for("int8", tmp=tmp_path), tmp_path)
    assert "Q/DQ" in (adapter.precision_notice("int8") or "")
    assert result.facts["precision_built"] == "fp32"
    assert "INT8" not in [args[0] for args in calls_of(trt, "IBuilderConfig.set_flag")]
    bf16 = adapter.precision_notice("bf16")
    assert (bf16 is None) == (version.startswith("10"))


def test_timing_cache_is_loaded_and_saved_back(tmp_path: Path) -> None:
    cache = tmp_path / "caches" / "a10g.cache"
    cache.parent.mkdir()
    cache.write_bytes(b"old")
    trt = make_tensorrt("10.13.3")
    build(trt, plan_for("fp32", timing_cache=str(cache), tmp=tmp_path), tmp_path)
    assert calls_of(trt, "IBuilderConfig.create_timing_cache") == [(b"old",)]
    assert calls_of(trt, "IBuilderConfig.set_timing_cache") == [(False,)]
    assert cache.read_bytes() == b"cache:old"


def test_missing_timing_cache_starts_empty_and_is_created(tmp_path: Path) -> None:
    trt = make_tensorrt("11.4.0")
    build(trt, plan_for("fp32", timing_cache="new.cache", tmp=tmp_path), tmp_path)
    assert calls_of(trt, "IBuilderConfig.create_timing_cache") == [(b"",)]
    assert (tmp_path / "new.cache").read_bytes() == b"cache:"


def test_time_budget_cancels_through_the_progress_monitor(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [0.0]
    monkeypatch.setattr("rlopt.backends.tensorrt.adapter.time.monotonic", lambda: clock[0])
    trt = make_tensorrt("10.13.3", steps=10, clock=clock)
    lines: list[str] = []
    with pytest.raises(StageError, match="exceeded its time budget"):
        build(trt, plan_for("fp32", budget=2.5, tmp=tmp_path), tmp_path, lines)
    assert not (tmp_path / "model.plan").exists()
    assert any("Building engine" in line for line in lines)


def test_parser_errors_are_one_stage_error(tmp_path: Path) -> None:
    trt = make_tensorrt("11.4.0", parse_ok=False)
    with pytest.raises(StageError, match="UNSUPPORTED_NODE"):
        build(trt, plan_for("fp32", tmp=tmp_path), tmp_path)
    assert "Builder.build_serialized_network" not in methods(trt)


@pytest.mark.parametrize("version", ["8.6.1", "12.0.0"])
def test_unsupported_majors_are_unavailable(version: str) -> None:
    with pytest.raises(BackendUnavailable, match="TensorRT 10 or 11"):
        TensorRTAdapter(make_tensorrt(version))


def test_stage_gate_skips_without_importing_tensorrt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.tensorrt.build import build_engine

    monkeypatch.setattr("rlopt.backends.tensorrt.availability.gpu_absent_reason", lambda: "no NVIDIA GPU (test)")
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    with pytest.raises(BackendUnavailable, match="needs an NVIDIA GPU: no NVIDIA GPU"):
        build_engine(tmp_path / "model.onnx", plan_for(tmp=tmp_path), tmp_path, recipe_path=tmp_path / "r.yaml",
                     network="policy")
    assert "tensorrt" not in sys.modules


@pytest.mark.parametrize("version, casts", [("10.13.3", "fp32"), ("11.4.0", "fp16")])
def test_stage_prepares_the_graph_then_builds(version: str, casts: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """With the gate open (stand-in module, GPU check patched), the stage prepares the ONNX and calls the adapter."""
    import onnx

    from rlopt.backends.tensorrt.build import build_engine

    trt = make_tensorrt(version)
    monkeypatch.setattr("rlopt.backends.tensorrt.availability.gpu_absent_reason", lambda: None)
    monkeypatch.setattr("rlopt.backends.tensorrt.availability.find_spec", lambda name: object())
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    onnx.save(mlp_model(), str(tmp_path / "model.onnx"))
    out = build_engine(tmp_path / "model.onnx", plan_for("fp16", tmp=tmp_path), tmp_path,
                       recipe_path=tmp_path / "r.yaml", network="policy", progress=lambda _: None)
    assert out.artifact == tmp_path / "model.plan"
    assert out.facts.prepared is not None and out.facts.prepared["precision_in_graph"] == casts
    assert calls_of(trt, "OnnxParser.parse_from_file") == [("model.trt.onnx",)]
    assert not (tmp_path / "model.trt.onnx").exists()
    assert out.facts.profiles[0]["obs"] == {"min": [1, 4], "opt": [4, 4], "max": [8, 4]}


def test_runner_call_sequence(tmp_path: Path) -> None:
    trt = make_tensorrt("11.4.0")
    plan_file = tmp_path / "model.plan"
    plan_file.write_bytes(b"ENGINE-BYTES")
    runner = TensorRTRunner(plan_file, ["obs"], {}, trt=trt, torch=make_cpu_torch())
    out = runner.infer({"obs": np.ones((2, 4), dtype=np.float32)})
    assert [o.shape for o in out] == [(2, 6)]
    run = [m for m in methods(trt) if m.startswith("IExecutionContext")]
    assert run == ["IExecutionContext.set_input_shape", "IExecutionContext.set_tensor_address",
                   "IExecutionContext.get_tensor_shape", "IExecutionContext.set_tensor_address",
                   "IExecutionContext.execute_async_v3"]
    assert calls_of(trt, "IExecutionContext.set_input_shape") == [("obs", (2, 4))]
    runner.close()


def test_runner_refuses_an_engine_it_cannot_deserialize(tmp_path: Path) -> None:
    plan_file = tmp_path / "model.plan"
    plan_file.write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match="cannot deserialize"):
        TensorRTRunner(plan_file, ["obs"], {}, trt=make_tensorrt("10.13.3"), torch=make_cpu_torch())


def test_runner_gate_without_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rlopt.backends.tensorrt.runner.gpu_absent_reason", lambda: "no NVIDIA GPU (test)")
    with pytest.raises(BackendUnavailable, match="needs an NVIDIA GPU"):
        TensorRTRunner(tmp_path / "model.plan", ["obs"], {})


def _real_tensorrt_missing() -> str | None:
    from rlopt.backends.tensorrt.build import tensorrt_unavailable_reason

    return tensorrt_unavailable_reason()


@pytest.mark.gpu
@pytest.mark.skipif(_real_tensorrt_missing() is not None, reason=str(_real_tensorrt_missing()))
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_real_engine_builds_and_matches_onnxruntime(precision: str, tmp_path: Path) -> None:
    """A real build: needs an NVIDIA GPU, TensorRT 10/11 and a CUDA build of torch."""
    import onnx
    import onnxruntime as ort

    from rlopt.backends.tensorrt.build import build_engine

    onnx.save(mlp_model(64), str(tmp_path / "model.onnx"))
    out = build_engine(tmp_path / "model.onnx", plan_for(precision, tmp=tmp_path), tmp_path,
                       recipe_path=tmp_path / "r.yaml", network="policy")
    runner = TensorRTRunner(out.artifact, ["obs"], out.facts)
    feeds = {"obs": np.random.default_rng(0).standard_normal((3, 4)).astype(np.float32)}
    expected = ort.InferenceSession(str(tmp_path / "model.onnx")).run(None, feeds)[0]
    got = runner.infer(feeds)[0]
    runner.close()
    assert np.allclose(got, expected, atol=1e-4 if precision == "fp32" else 2e-2, rtol=1e-2)
