"""The OpenVINO backend's parts that need no OpenVINO: its descriptor, the precision rule, the stage's cache key, and
its Triton config checked with Triton's own ModelConfig protobuf."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from rlopt.backends import BACKENDS, DEFAULT_BACKENDS
from rlopt.backends.openvino.convert import choose_precision, input_bounds
from rlopt.backends.openvino.facts import OpenVinoFacts
from rlopt.backends.openvino.stages import OpenVinoConvert
from rlopt.recipe import InputSpec, NetworkSpec


def test_registered_but_not_in_the_default_backends() -> None:
    backend = BACKENDS["openvino"]
    assert backend.facts is OpenVinoFacts and backend.refit and backend.one_thread and backend.native
    assert "openvino" not in DEFAULT_BACKENDS and set(DEFAULT_BACKENDS) < set(BACKENDS)


def test_threads_come_from_the_facts() -> None:
    backend = BACKENDS["openvino"]
    assert backend.threads(OpenVinoFacts(inference_num_threads=3)) == 3
    assert backend.threads(OpenVinoFacts(threads_at_build=2)) == "OpenVINO default for LATENCY, 2 when built"
    assert backend.one_thread(OpenVinoFacts(onnx="model.onnx")).as_dict() == {"onnx": "model.onnx",
                                                                              "inference_num_threads": 1}


def test_the_weights_travel_with_the_ir() -> None:
    weights = {"path": "policy/model.bin", "sha256": "0" * 64, "bytes": 8}
    assert [ref.model_dump() for ref in OpenVinoFacts.of({"weights": weights}).companion_files()] == [weights]
    assert OpenVinoFacts().companion_files() == []


@pytest.mark.parametrize("requested, capabilities, built, hint, notice", [
    ("fp32", ["FP32", "BF16"], "fp32", "f32", None),
    ("bf16", ["FP32", "BF16"], "bf16", "bf16", None),
    ("fp16", ["FP32", "FP16"], "fp16", "f16", None),
    ("bf16", ["FP32"], "fp32", "f32", "precision bf16 not applied: this CPU lacks BF16"),
    ("fp16", ["FP32", "BF16"], "fp32", "f32", "precision fp16 not applied: this CPU lacks FP16"),
    ("int8", ["FP32", "INT8"], "fp32", "f32", "precision int8 not applied: OpenVINO int8 needs NNCF"),
])
def test_precision_follows_the_cpu_and_says_so_when_it_cannot(requested: str, capabilities: list[str], built: str,
                                                             hint: str, notice: str | None) -> None:
    got = choose_precision(requested, capabilities)
    assert got[:2] == (built, hint)
    assert (got[2] is None) if notice is None else (got[2] is not None and got[2].startswith(notice))


def _ctx(precision: str = "fp32") -> Any:
    spec = NetworkSpec(inputs={"obs": InputSpec(min=[1, 8], opt=[2, 8], max=[4, 8])}, outputs=["out"],
                       precision=precision)
    return SimpleNamespace(spec=spec)


def test_the_stage_key_holds_the_openvino_version_and_for_a_reduced_precision_the_cpu(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends import stage_versions, tool_versions
    from rlopt.lazy import version_of

    stage = OpenVinoConvert()
    assert input_bounds(_ctx().spec) == {"obs": [[1, 4], [8, 8]]}
    config = stage.config(_ctx())
    assert config["openvino"] == version_of("openvino") and config["cpu"] is None
    assert config["input_bounds"] == {"obs": [[1, 4], [8, 8]]} and config["precision"] == "fp32"
    assert stage.config(_ctx("bf16"))["cpu"], "bf16 is built only where the CPU has it"
    monkeypatch.setattr("rlopt.backends.openvino.convert.version_of",
                        lambda name: "9999.1" if name == "openvino" else version_of(name))
    assert stage.config(_ctx())["openvino"] == "9999.1", "a new OpenVINO misses the cache"
    assert "openvino" in tool_versions() and "openvino" in stage_versions("openvino"), "its stages' keys hold it"
    assert "openvino" not in stage_versions() and "openvino" not in stage_versions("tvm"), \
        "installing the extra keeps every other stage's cache entries"


def test_triton_config_is_one_for_tritons_openvino_backend() -> None:
    from tests.test_triton import LOGITS, POLICY, POLICY_DIMS, agrees_with_profile, make, parse

    from rlopt.compile.triton import model_config, to_pbtxt

    plan = make(POLICY, POLICY_DIMS)
    config = parse(to_pbtxt(model_config("heads_policy_openvino", "openvino", plan, LOGITS, {"obs": "float32"})))
    assert (config.backend, config.platform, config.default_model_filename) == ("openvino", "", "model.xml")
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching"), \
        "Triton's OpenVINO backend fixes the batch at max_batch_size: every request keeps its own shape instead"
    assert [list(t.dims) for t in config.input] == [[-1, -1, 64]]
    assert [list(t.dims) for t in config.output] == [[-1, -1, 6]]
    assert [(w.name, w.batch_size, list(w.inputs["obs"].dims)) for w in config.model_warmup] == [
        ("profile_min", 1, [1, 1, 64]), ("profile_opt", 1, [4, 8, 64]), ("profile_max", 1, [8, 16, 64])]
    assert [(g.kind, g.count) for g in config.instance_group] == [(config.instance_group[0].KIND_CPU, 1)]
    assert {k: v.string_value for k, v in config.parameters.items()} == {"PERFORMANCE_HINT": "LATENCY",
                                                                          "NUM_STREAMS": "1"}
    agrees_with_profile(config, plan)
