"""Triton model repository: every config.pbtxt parses with Triton's real ModelConfig protobuf and agrees
with the optimization profile it was generated from."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

from rlopt.backends.tensorrt.config import TensorRTConfig
from rlopt.recipe import InputSpec, NetworkSpec, ProfileRange
from rlopt.backends.tensorrt.plan import TensorRTPlan, make_plan
from rlopt.compile.triton import OutputShapes, model_config, output_shapes, to_pbtxt, write_models

model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
text_format = pytest.importorskip("google.protobuf.text_format")


def parse(text: str):
    return text_format.Parse(text, model_config_pb2.ModelConfig())


def make(inputs: dict[str, InputSpec], dims: dict[str, list], profiles: list | None = None) -> TensorRTPlan:
    values = [helper.make_tensor_value_info(n, TensorProto.FLOAT, d) for n, d in dims.items()]
    nodes = [helper.make_node("Identity", [n], [f"{n}_o"]) for n in dims]
    model = helper.make_model(helper.make_graph(nodes, "g", values, [
        helper.make_tensor_value_info(f"{n}_o", TensorProto.FLOAT, None) for n in dims]))
    network = NetworkSpec(inputs=inputs, outputs=["logits"], profiles=profiles or [])
    return make_plan(network, TensorRTConfig(), model, recipe_path=Path("r.yaml"), network="policy")


POLICY = {"obs": InputSpec(min=[1, 1, 64], opt=[4, 8, 64], max=[8, 16, 64])}
POLICY_DIMS = {"obs": ["batch", "obs_d1", 64]}
LOGITS = [OutputShapes("logits", "float32", {"min": (1, 1, 6), "opt": (4, 8, 6), "max": (8, 16, 6)})]


def agrees_with_profile(config, plan: TensorRTPlan) -> None:
    """The invariant Triton users need: nothing in the config can ask for a shape outside profile 0."""
    envelope = plan.envelope
    batching = config.max_batch_size > 0
    for tensor in config.input:
        name = tensor.name.split("__")[0]
        shape = envelope[name]
        full = ([-1] if batching else []) + list(tensor.dims)
        assert len(full) == len(shape.min)
        for axis, dim in enumerate(full):
            assert dim == (-1 if shape.dynamic(axis) else shape.min[axis]), (name, axis)
        if batching:
            assert shape.min[0] == 1 and shape.max[0] == config.max_batch_size
    for size in config.dynamic_batching.preferred_batch_size:
        assert 1 <= size <= config.max_batch_size
    assert config.model_warmup, "warmup requests are generated from the profile"
    for warmup in config.model_warmup:
        for name, value in warmup.inputs.items():
            shape = envelope[name.split("__")[0]]
            full = ([warmup.batch_size] if batching else []) + list(value.dims)
            assert all(lo <= d <= hi for d, lo, hi in zip(full, shape.min, shape.max)), (warmup.name, full)


@pytest.mark.parametrize("backend, platform", [("tensorrt", "tensorrt_plan"), ("onnxruntime", "onnxruntime_onnx"),
                                               ("torchscript", "pytorch_libtorch")])
def test_batched_config_parses_and_agrees(backend: str, platform: str) -> None:
    plan = make(POLICY, POLICY_DIMS)
    config = parse(to_pbtxt(model_config(f"heads_policy_{backend}", backend, plan, LOGITS, {"obs": "float32"})))
    assert config.platform == platform and config.max_batch_size == 8
    assert [list(t.dims) for t in config.input] == [[-1, 64]]
    assert [list(t.dims) for t in config.output] == [[-1, 6]]
    assert list(config.dynamic_batching.preferred_batch_size) == [4, 8]
    assert [(w.name, w.batch_size) for w in config.model_warmup] == [("profile_min", 1), ("profile_opt", 4),
                                                                     ("profile_max", 8)]
    agrees_with_profile(config, plan)


def test_pytorch_names_follow_the_index_convention() -> None:
    config = parse(to_pbtxt(model_config("m", "torchscript", make(POLICY, POLICY_DIMS), LOGITS, {"obs": "float32"})))
    assert [t.name for t in config.input] == ["obs__0"] and [t.name for t in config.output] == ["logits__0"]
    assert list(config.model_warmup[0].inputs) == ["obs__0"]


def test_no_batching_when_the_profile_batch_does_not_start_at_1() -> None:
    inputs = {"obs": InputSpec(min=[2, 64], opt=[4, 64], max=[8, 64])}
    plan = make(inputs, {"obs": ["batch", 64]})
    outputs = [OutputShapes("logits", "float32", {"min": (2, 6), "opt": (4, 6), "max": (8, 6)})]
    config = parse(to_pbtxt(model_config("m", "onnxruntime", plan, outputs, {"obs": "float32"})))
    assert config.max_batch_size == 0 and not config.HasField("dynamic_batching")
    assert [list(t.dims) for t in config.input] == [[-1, 64]] and [list(t.dims) for t in config.output] == [[-1, 6]]
    assert all(w.batch_size == 1 for w in config.model_warmup)
    agrees_with_profile(config, plan)


def test_no_batching_when_an_output_is_not_batched() -> None:
    outputs = [OutputShapes("logits", "float32", {"min": (6,), "opt": (6,), "max": (6,)})]
    config = parse(to_pbtxt(model_config("m", "tensorrt", make(POLICY, POLICY_DIMS), outputs, {"obs": "float32"})))
    assert config.max_batch_size == 0 and [list(t.dims) for t in config.input] == [[-1, -1, 64]]


def test_static_shapes_and_duplicate_points() -> None:
    plan = make({"obs": InputSpec(shape=[1, 64])}, {"obs": [1, 64]})
    outputs = [OutputShapes("logits", "float32", {"min": (1, 6)})]
    config = parse(to_pbtxt(model_config("m", "tensorrt", plan, outputs, {"obs": "float32"})))
    assert config.max_batch_size == 0 and list(config.input[0].dims) == [1, 64]
    assert [w.name for w in config.model_warmup] == ["profile_min"]


def test_every_tensorrt_profile_is_offered_to_the_instance() -> None:
    extra = [{"obs": ProfileRange(min=[1, 1, 64], opt=[1, 1, 64], max=[1, 4, 64])}]
    plan = make(POLICY, POLICY_DIMS, extra)
    config = parse(to_pbtxt(model_config("m", "tensorrt", plan, LOGITS, {"obs": "float32"})))
    assert [list(g.profile) for g in config.instance_group] == [["0", "1"]]
    agrees_with_profile(config, plan)


def test_output_shapes_from_reference_arrays() -> None:
    arrays = {"min:out:logits": np.zeros((3, 1, 1, 6), np.float32),
              "max:out:logits": np.zeros((3, 8, 16, 6), np.float32)}
    (shapes,) = output_shapes(arrays, ["logits"])
    assert shapes.dims() == [-1, -1, 6] and shapes.dtype == "float32"


def test_write_models_lays_out_the_repository(tmp_path: Path) -> None:
    (tmp_path / "model.onnx").write_bytes(b"onnx")
    (tmp_path / "model.ts").write_bytes(b"ts")
    artifacts = {"onnxruntime": tmp_path / "model.onnx", "torchscript": tmp_path / "model.ts",
                 "tvm": tmp_path / "tvm.so"}
    written = write_models(tmp_path / "triton", "heads", "policy", artifacts, make(POLICY, POLICY_DIMS), LOGITS,
                           {"obs": "float32"})
    assert sorted(p.relative_to(tmp_path).as_posix() for p in written) == [
        "triton/heads_policy_onnxruntime/1/model.onnx", "triton/heads_policy_onnxruntime/config.pbtxt",
        "triton/heads_policy_torchscript/1/model.pt", "triton/heads_policy_torchscript/config.pbtxt"]
    assert (tmp_path / "triton/heads_policy_onnxruntime/1/model.onnx").read_bytes() == b"onnx"
    config = parse((tmp_path / "triton/heads_policy_onnxruntime/config.pbtxt").read_text())
    assert config.name == "heads_policy_onnxruntime"
