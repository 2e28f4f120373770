"""Small ONNX graphs and TensorRT plans for the TensorRT tests (adapter, runner, names, refit)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from rlopt.backends.tensorrt.adapter import TensorRTAdapter
from rlopt.backends.tensorrt.plan import TensorRTPlan, make_plan
from rlopt.backends.tensorrt.config import TensorRTConfig
from rlopt.recipe import InputSpec, NetworkSpec, ProfileRange


def mlp_model(hidden: int = 8, width: int = 4) -> object:
    """obs [batch, width] -> MatMul -> Add bias -> Relu -> MatMul -> logits [batch, 6], weights scaled like
    PyTorch's Linear initialisation (outputs of order 1)."""
    rng = np.random.default_rng(0)
    w1 = numpy_helper.from_array((rng.standard_normal((width, hidden)) / np.sqrt(width)).astype(np.float32), "w1")
    b1 = numpy_helper.from_array((rng.standard_normal(hidden) * 0.1).astype(np.float32), "b1")
    w2 = numpy_helper.from_array((rng.standard_normal((hidden, 6)) / np.sqrt(hidden)).astype(np.float32), "w2")
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["obs", "w1"], ["h"]), helper.make_node("Add", ["h", "b1"], ["hb"]),
         helper.make_node("Relu", ["hb"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["logits"])],
        "mlp", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", width])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", 6])], [w1, b1, w2])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def plan_for(precision: str = "fp16", *, extra_profile: bool = False, timing_cache: str | None = None,
             budget: float = 60.0, refit: bool = True, tf32: bool = False, width: int = 4, hidden: int = 8,
             tmp: Path = Path(".")) -> TensorRTPlan:
    inputs = {"obs": InputSpec(min=[1, width], opt=[4, width], max=[8, width])}
    profiles = [{"obs": ProfileRange(min=[1, width], opt=[1, width], max=[2, width])}] if extra_profile else []
    spec = NetworkSpec(inputs=inputs, outputs=["logits"], precision=precision, profiles=profiles)
    config = TensorRTConfig(workspace_mb=256, refittable=refit, builder_optimization_level=4,
                            timing_cache=timing_cache, build_timeout_s=budget, tf32=tf32)
    return make_plan(spec, config, mlp_model(hidden, width), recipe_path=tmp / "recipe.yaml", network="policy")


def methods(trt) -> list[str]:
    return [f"{owner}.{method}" for owner, method, _ in trt._calls]


def calls_of(trt, name: str) -> list[tuple]:
    return [args for owner, method, args in trt._calls if f"{owner}.{method}" == name]


def build(trt, plan: TensorRTPlan, tmp: Path, lines: list[str] | None = None, *, hidden: int = 8,
          width: int = 4):
    """The adapter's build of `mlp_model(hidden, width)` (as the stage prepares it, folded) into tmp/model.plan."""
    import onnx

    onnx_path = tmp / "model.onnx"
    onnx.save(mlp_model(hidden, width), str(onnx_path))
    adapter = TensorRTAdapter(trt, progress=(lines.append if lines is not None else lambda _: None))
    return adapter, adapter.build(onnx_path, plan, tmp / "model.plan")


def open_the_gate(monkeypatch, trt, torch=None) -> None:
    """TensorRT 'installed' here: the stand-in module, a torch whose CUDA is the CPU, the GPU gate open."""
    from tests.cuda_standin import make_cuda_torch

    fake_torch = torch or make_cuda_torch()
    monkeypatch.setattr("rlopt.backends.tensorrt.gate.unavailable_reason", lambda: None)
    monkeypatch.setattr("rlopt.backends.tensorrt.gate.load_tensorrt", lambda: trt)
    monkeypatch.setattr("rlopt.backends.tensorrt.gate.cuda_torch", lambda: fake_torch)
