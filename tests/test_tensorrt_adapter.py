"""The TensorRT adapter and build stage against a stand-in that refuses what TensorRT refuses (tests/tensorrt_standin.py).

They check which TensorRT API calls rlopt makes, in which order and with which values, for TensorRT 10 and 11, and
what the engine the stand-in builds from them computes. Real builds are the `gpu`-marked test at the end, which runs
only where an NVIDIA GPU, TensorRT and a CUDA build of torch are present.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from rlopt.errors import BackendUnavailable, StageError
from rlopt.backends.tensorrt.adapter import TensorRTAdapter
from tests.tensorrt_models import build, calls_of, methods, mlp_model, plan_for
from tests.tensorrt_standin import make_tensorrt


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
    assert trt.Runtime(None).deserialize_cuda_engine((tmp_path / "model.plan").read_bytes()) is not None
    assert result.engine_bytes == (tmp_path / "model.plan").stat().st_size
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
@pytest.mark.parametrize("tf32", [False, True])
def test_fp32_engines_clear_tf32_unless_the_recipe_allows_it(version: str, tf32: bool, tmp_path: Path) -> None:
    """TF32 is on in a fresh builder config; an fp32 engine is built with it cleared (tensorrt.tf32: true keeps it,
    and the engine is then recorded as tf32)."""
    trt = make_tensorrt(version)
    _, result = build(trt, plan_for("fp32", tf32=tf32, tmp=tmp_path), tmp_path)
    flags = {name for (name,) in calls_of(trt, "IBuilderConfig.set_flag")}
    cleared = {name for (name,) in calls_of(trt, "IBuilderConfig.clear_flag")}
    assert ("TF32" in cleared) != tf32 and ("TF32" in flags) == tf32
    engine = trt.Runtime(None).deserialize_cuda_engine((tmp_path / "model.plan").read_bytes())
    assert engine._state["rounding"] == ("TF32" if tf32 else None)
    assert result.facts["precision_built"] == ("tf32" if tf32 else "fp32")


@pytest.mark.parametrize("version", ["10.13.3", "11.4.0"])
def test_one_optimization_profile_per_plan_profile(version: str, tmp_path: Path) -> None:
    trt = make_tensorrt(version)
    build(trt, plan_for("fp32", extra_profile=True, refit=False, tmp=tmp_path), tmp_path)
    assert calls_of(trt, "IOptimizationProfile.set_shape") == [("obs", (1, 4), (4, 4), (8, 4)),
                                                                ("obs", (1, 4), (1, 4), (2, 4))]
    assert len(calls_of(trt, "IBuilderConfig.add_optimization_profile")) == 2
    assert calls_of(trt, "IBuilderConfig.set_flag") == []
    engine = trt.Runtime(None).deserialize_cuda_engine((tmp_path / "model.plan").read_bytes())
    assert engine.num_optimization_profiles == 2
    assert engine.get_tensor_profile_shape("obs", 1) == [(1, 4), (1, 4), (2, 4)]


def test_a_refused_optimization_profile_is_a_stage_error(tmp_path: Path) -> None:
    """add_optimization_profile returns -1 for a profile TensorRT refuses; the build must not go on without it."""
    from dataclasses import replace

    from rlopt.backends.tensorrt.plan import OptimizationProfile, ShapeRange

    trt = make_tensorrt("11.4.0")
    plan = plan_for("fp32", extra_profile=True, tmp=tmp_path)
    backwards = OptimizationProfile((("obs", ShapeRange((2, 4), (1, 4), (1, 4))),))  # max < min
    with pytest.raises(StageError, match="refused optimization profile 1"):
        build(trt, replace(plan, shapes=replace(plan.shapes, profiles=(plan.profiles[0], backwards))), tmp_path)
    assert "Builder.build_serialized_network" not in methods(trt)


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


def test_a_timing_cache_of_another_gpu_is_one_located_error_and_left_alone(tmp_path: Path) -> None:
    """set_timing_cache returns False for a cache TensorRT will not take; the build stops and keeps the file."""
    cache = tmp_path / "other.cache"
    cache.write_bytes(b"elsewhere: another GPU's tactics")
    with pytest.raises(StageError, match=r"other\.cache: tensorrt\.timing_cache: TensorRT refused this timing cache"):
        build(make_tensorrt("10.13.3"), plan_for("fp32", timing_cache=str(cache), tmp=tmp_path), tmp_path)
    assert cache.read_bytes() == b"elsewhere: another GPU's tactics"


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


def test_cuda_that_cannot_start_is_a_skip_with_the_reason(tmp_path: Path) -> None:
    """pybind11 turns TensorRT's null Builder (CUDA failed to initialise) into a TypeError: a skip, never exit 3."""
    with pytest.raises(BackendUnavailable, match="could not create its builder .*CUDA did not start"):
        build(make_tensorrt("10.13.3", cuda_fails=True), plan_for("fp32", tmp=tmp_path), tmp_path)


def test_stage_gate_skips_without_importing_tensorrt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.tensorrt.build import build_engine

    monkeypatch.setattr("rlopt.backends.tensorrt.gate.gpu_absent_reason", lambda: "no NVIDIA GPU (test)")
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    with pytest.raises(BackendUnavailable, match="needs an NVIDIA GPU: no NVIDIA GPU"):
        build_engine(tmp_path / "model.onnx", plan_for(tmp=tmp_path), tmp_path, recipe_path=tmp_path / "r.yaml",
                     network="policy")
    assert "tensorrt" not in sys.modules


def test_gate_needs_a_cuda_build_of_torch(monkeypatch: pytest.MonkeyPatch) -> None:
    """unavailable_reason("tensorrt") looks at torch's build too: the runner takes its buffers from torch."""
    from rlopt.backends import unavailable_reason

    monkeypatch.setattr("rlopt.backends.tensorrt.gate.gpu_absent_reason", lambda: None)
    monkeypatch.setattr("rlopt.backends.tensorrt.gate.find_spec", lambda name: object())
    monkeypatch.setattr("rlopt.backends.tensorrt.gate.torch_cuda_build", lambda: None)
    assert "torch is a CPU build" in (unavailable_reason("tensorrt") or "")
    monkeypatch.setattr("rlopt.backends.tensorrt.gate.torch_cuda_build", lambda: "12.8")
    assert unavailable_reason("tensorrt") is None


@pytest.mark.parametrize("version, casts", [("10.13.3", "fp32"), ("11.4.0", "fp16")])
def test_stage_prepares_the_graph_then_builds(version: str, casts: str, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """With the gate open (stand-in module, GPU check patched), the stage prepares the ONNX and calls the adapter."""
    out = _stage_build(make_tensorrt(version), "fp16", tmp_path, monkeypatch)
    assert out.artifact == tmp_path / "model.plan"
    assert out.facts.prepared is not None and out.facts.prepared["precision_in_graph"] == casts
    assert not (tmp_path / "model.trt.onnx").exists()
    assert out.facts.profiles[0]["obs"] == {"min": [1, 4], "opt": [4, 4], "max": [8, 4]}


def test_bf16_on_tensorrt_11_builds_fp32_with_the_notice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """TensorRT 11 takes precision from the graph and rlopt writes fp16 casts only: bf16 falls back to fp32."""
    trt = make_tensorrt("11.4.0")
    out = _stage_build(trt, "bf16", tmp_path, monkeypatch)
    assert out.facts.precision_built == "fp32" and (out.facts.prepared or {})["precision_in_graph"] == "fp32"
    assert (out.facts.notice or "").startswith("bf16 not applied")
    assert calls_of(trt, "OnnxParser.parse_from_file") == [("model.trt.onnx",)]


def _stage_build(trt, precision: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    import onnx

    from rlopt.backends.tensorrt.build import build_engine

    monkeypatch.setattr("rlopt.backends.tensorrt.gate.unavailable_reason", lambda: None)
    monkeypatch.setattr("rlopt.backends.tensorrt.gate.load_tensorrt", lambda: trt)
    onnx.save(mlp_model(), str(tmp_path / "model.onnx"))
    return build_engine(tmp_path / "model.onnx", plan_for(precision, tmp=tmp_path), tmp_path,
                        recipe_path=tmp_path / "r.yaml", network="policy", progress=lambda _: None)


def _real_tensorrt_missing() -> str | None:
    from rlopt.backends.tensorrt.build import tensorrt_unavailable_reason

    return tensorrt_unavailable_reason()


@pytest.mark.gpu
@pytest.mark.skipif(_real_tensorrt_missing() is not None, reason=str(_real_tensorrt_missing()))
@pytest.mark.parametrize("precision", ["fp32", "fp16"])
def test_real_engine_builds_and_matches_onnxruntime(precision: str, tmp_path: Path) -> None:
    """A real build at hidden size 768: fp32 within the recipe's fp32 gate (TF32 cleared), fp16 within the
    reduced-precision gate. Needs an NVIDIA GPU, TensorRT 10/11 and a CUDA build of torch."""
    import onnx
    import onnxruntime as ort

    from rlopt.backends.tensorrt.build import build_engine
    from rlopt.backends.tensorrt.runner import TensorRTRunner

    onnx.save(mlp_model(768, 768), str(tmp_path / "model.onnx"))
    out = build_engine(tmp_path / "model.onnx", plan_for(precision, width=768, hidden=768, tmp=tmp_path), tmp_path,
                       recipe_path=tmp_path / "r.yaml", network="policy")
    runner = TensorRTRunner(out.artifact, ["obs"], out.facts)
    feeds = {"obs": np.random.default_rng(0).standard_normal((3, 768)).astype(np.float32)}
    expected = ort.InferenceSession(str(tmp_path / "model.onnx")).run(None, feeds)[0]
    got = runner.infer(feeds)[0]
    runner.close()
    atol, rtol = (1e-4, 1e-3) if precision == "fp32" else (1e-2, 1e-2)
    assert np.all(np.abs(got - expected) <= atol + rtol * np.abs(expected)), precision


def test_a_compile_where_cuda_cannot_start_skips_tensorrt_with_the_reason(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole compile: TensorRT 'installed', its Builder null (CUDA failed): skipped, the rest verified, no crash."""
    from rlopt.compile import compile_recipe
    from rlopt.compile.cache import StageCache
    from rlopt.manifest import read_manifest
    from tests.conftest import write_tiny_recipe
    from tests.tensorrt_models import open_the_gate

    open_the_gate(monkeypatch, make_tensorrt("10.13.3", cuda_fails=True))
    recipe = write_tiny_recipe(tmp_path, backends="[torchscript, tensorrt]")
    result = compile_recipe(recipe, tmp_path / "out", cache=StageCache(enabled=False))
    assert result.passed, result.failures
    for network in read_manifest(result.model_dir).networks.values():
        assert "could not create its builder" in (network.artifacts["tensorrt"].skipped or "")
        assert network.artifacts["torchscript"].verified
