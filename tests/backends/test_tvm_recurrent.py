"""ONNX LSTM / GRU / RNN unrolled for TVM (rlopt.backends.tvm.recurrent): each attribute variant against ONNX
Runtime running the original node, at a static length and at a dynamic one (masked to the bound); TVM builds of
a few; the variants it refuses, named."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlopt.backends.tvm.recurrent import expand_recurrent
from rlopt.errors import BackendUnavailable

T, BATCH, INPUT, HIDDEN = 5, 3, 4, 6


def recurrent_model(op: str, *, direction: str = "forward", layout: int = 0, bias: bool = True, h0: bool = True,
                    c0: bool = True, peepholes: bool = False, dynamic: bool = False, seed: int = 0,
                    **attrs: Any) -> onnx.ModelProto:
    """One random `op` node (W, R, B, P as initializers), inputs x (and h0, c0), every output a graph output."""
    rng = np.random.default_rng(seed)
    gates, dirs = {"LSTM": 4, "GRU": 3, "RNN": 1}[op], 2 if direction == "bidirectional" else 1

    def weight(name: str, *shape: int) -> onnx.TensorProto:
        return numpy_helper.from_array((rng.standard_normal(shape) * 0.5).astype(np.float32), name)

    initializers = [weight("W", dirs, gates * HIDDEN, INPUT), weight("R", dirs, gates * HIDDEN, HIDDEN)]
    inputs = ["x", "W", "R", "", ""]
    if bias:
        initializers.append(weight("B", dirs, 2 * gates * HIDDEN))
        inputs[3] = "B"
    length = "T" if dynamic else T
    x_dims = [length, BATCH, INPUT] if layout == 0 else [BATCH, length, INPUT]
    state_dims = [dirs, BATCH, HIDDEN] if layout == 0 else [BATCH, dirs, HIDDEN]
    graph_inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_dims)]
    for name, wanted in (("h0", h0), ("c0", c0 and op == "LSTM")):
        inputs.append(name if wanted else "")
        if wanted:
            graph_inputs.append(helper.make_tensor_value_info(name, TensorProto.FLOAT, state_dims))
    if op != "LSTM":
        inputs = inputs[:6]
    if peepholes:
        initializers.append(weight("P", dirs, 3 * HIDDEN))
        inputs.append("P")
    while inputs[-1] == "":
        inputs.pop()
    outputs = ["y", "y_h"] + (["y_c"] if op == "LSTM" else [])
    layout_attr = {"layout": layout} if layout else {}
    node = helper.make_node(op, inputs, outputs, name="rnn", hidden_size=HIDDEN, direction=direction,
                            **layout_attr, **attrs)
    graph = helper.make_graph([node], "g", graph_inputs,
                              [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs],
                              initializer=initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def feeds_for(model: onnx.ModelProto, length: int, seed: int = 1) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    layout = next((a.i for a in model.graph.node[0].attribute if a.name == "layout"), 0)
    dirs = 2 if b"bidirectional" in model.graph.node[0].SerializeToString() else 1
    shapes = {"x": [length, BATCH, INPUT], "h0": [dirs, BATCH, HIDDEN], "c0": [dirs, BATCH, HIDDEN]}
    feeds = {}
    for value in model.graph.input:
        array = rng.standard_normal(shapes[value.name]).astype(np.float32)
        feeds[value.name] = np.ascontiguousarray(array.transpose(1, 0, 2)) if layout else array
    return feeds


def onnxruntime_outputs(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The original node in ONNX Runtime; its CPU kernels have no layout 1, so that runs as layout 0 on
    transposed tensors (what layout 1 means)."""
    layout = next((a.i for a in model.graph.node[0].attribute if a.name == "layout"), 0)
    if not layout:
        return ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    plain = onnx.ModelProto()
    plain.CopyFrom(model)
    next(a for a in plain.graph.node[0].attribute if a.name == "layout").i = 0
    for value in plain.graph.input:
        value.type.tensor_type.ClearField("shape")
    swapped = {k: np.ascontiguousarray(v.transpose(1, 0, 2)) for k, v in feeds.items()}
    y, *states = ort.InferenceSession(plain.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, swapped)
    return [y.transpose(2, 0, 1, 3), *[s.transpose(1, 0, 2) for s in states]]


def unrolled(model: onnx.ModelProto, shapes: Any = None, bounds: Any = None) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    assert expand_recurrent(copy, shapes, bounds) == 1
    assert {node.op_type for node in copy.graph.node}.isdisjoint({"LSTM", "GRU", "RNN"})
    assert "MatMul" in {node.op_type for node in copy.graph.node}
    return copy


def bounds_for(model: onnx.ModelProto, low: int, high: int) -> tuple[dict, dict]:
    layout = next((a.i for a in model.graph.node[0].attribute if a.name == "layout"), 0)
    shapes = {name: list(array.shape) for name, array in feeds_for(model, low).items()}
    top = {name: list(dims) for name, dims in shapes.items()}
    top["x"][1 if layout else 0] = high
    return shapes, top


# per op: every direction x layout, with B and initial_h present or absent in all four combinations among them
# (the whole cross product is 72 cases, each an ONNX Runtime session or four)
VARIANTS = [dict(op=op, direction=d, layout=layout, bias=index % 2 == 0, h0=index // 2 % 2 == 0)
            for op in ("LSTM", "GRU", "RNN")
            for index, (d, layout) in enumerate(itertools.product(["forward", "reverse", "bidirectional"], [0, 1]))]
VARIANTS += [dict(op="LSTM", peepholes=True), dict(op="LSTM", peepholes=True, c0=False), dict(op="LSTM", clip=0.7),
             dict(op="LSTM", input_forget=1), dict(op="LSTM", activations=["Sigmoid", "Relu", "Tanh"]),
             dict(op="LSTM", h0=True, c0=False),
             dict(op="GRU", linear_before_reset=0), dict(op="GRU", linear_before_reset=0, h0=False),
             dict(op="GRU", clip=0.5), dict(op="RNN", activations=["Relu"]),
             dict(op="RNN", direction="bidirectional", activations=["Relu", "Tanh"])]
for _variant in VARIANTS:
    if _variant["op"] == "GRU":
        _variant.setdefault("linear_before_reset", 1)  # as torch exports nn.GRU


def _label(variant: dict) -> str:
    return "-".join(f"{k}={v}" for k, v in variant.items())


@pytest.mark.parametrize("variant", VARIANTS, ids=_label)
def test_unrolled_node_matches_onnxruntime_at_a_static_and_a_dynamic_length(variant: dict) -> None:
    model = recurrent_model(**variant)
    feeds = feeds_for(model, T)
    static = unrolled(model, {name: list(array.shape) for name, array in feeds.items()})
    got = ort.InferenceSession(static.SerializeToString(), providers=["CPUExecutionProvider"]).run(None, feeds)
    for want, have in zip(onnxruntime_outputs(model, feeds), got):
        np.testing.assert_allclose(have, want, atol=2e-6, rtol=1e-5)
    dynamic = recurrent_model(**variant, dynamic=True)
    masked = unrolled(dynamic, bounds=bounds_for(dynamic, 1, 7))
    session = ort.InferenceSession(masked.SerializeToString(), providers=["CPUExecutionProvider"])
    for length in (1, 4, 7):  # the bound's first step, one inside, the bound itself
        feeds = feeds_for(dynamic, length, seed=length)
        for want, have in zip(onnxruntime_outputs(dynamic, feeds), session.run(None, feeds)):
            assert have.shape == want.shape
            np.testing.assert_allclose(have, want, atol=2e-6, rtol=1e-5)


def test_a_fixed_length_in_a_dynamic_import_unrolls_exactly_and_an_unbounded_one_is_left_alone() -> None:
    model = recurrent_model("GRU", linear_before_reset=1)
    copy = unrolled(model)  # T is a fixed dim in the graph: no shapes or bounds needed
    assert sum(node.op_type == "Where" for node in copy.graph.node) == 0, "no masking for a fixed length"
    dynamic = recurrent_model("GRU", linear_before_reset=1, dynamic=True)
    assert expand_recurrent(dynamic) == 0 and dynamic.graph.node[0].op_type == "GRU"


@pytest.mark.parametrize("attrs, problem", [
    (dict(activations=["HardSigmoid", "Tanh", "Tanh"]), "activations ['HardSigmoid', 'Tanh', 'Tanh'] are not supported"),
    (dict(activation_alpha=[0.5]), "activation_alpha / activation_beta are not supported"),
])
def test_variants_it_cannot_express_are_refused_naming_node_and_attribute(attrs: dict, problem: str) -> None:
    model = recurrent_model("LSTM", **attrs)
    with pytest.raises(BackendUnavailable, match=r"^tvm: LSTM node rnn: " + problem.replace("[", r"\[")
                       .replace("]", r"\]").replace("(", r"\(").replace(")", r"\)")):
        expand_recurrent(model, {name: list(a.shape) for name, a in feeds_for(model, T).items()})


def test_a_sequence_lens_input_is_refused() -> None:
    model = recurrent_model("GRU", linear_before_reset=1)
    model.graph.node[0].input[4] = "lens"
    model.graph.input.append(helper.make_tensor_value_info("lens", TensorProto.INT32, [BATCH]))
    with pytest.raises(BackendUnavailable, match="tvm: GRU node rnn: a sequence_lens input is not supported"):
        expand_recurrent(model)


# one TVM build in the default run (a dynamic length, the harder unroll); the other two with the slow tests
@pytest.mark.parametrize("variant, dynamic", [
    pytest.param(dict(op="LSTM", peepholes=True), False, marks=pytest.mark.slow),
    (dict(op="GRU", linear_before_reset=1, direction="bidirectional"), True),
    pytest.param(dict(op="RNN", h0=False, direction="reverse"), True, marks=pytest.mark.slow)], ids=str)
def test_tvm_builds_the_unrolled_node_with_weights_as_parameters_and_matches(variant: dict, dynamic: bool) -> None:
    import tvm
    from tvm import relax

    from rlopt.backends.tvm.importer import fold_weight_layouts, import_relax
    from rlopt.backends.tvm.params import bind_params

    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    model = recurrent_model(**variant, dynamic=dynamic)
    static = {name: list(array.shape) for name, array in feeds_for(model, T).items()}
    mod, facts = import_relax(model, target, None if dynamic else static, weights_as_params=True,
                              bounds=bounds_for(model, 1, 7) if dynamic else None)
    assert facts["recurrent_unrolled"] == 1 and any(k.startswith("fused_matmul") for k in facts["fused_kernels"])
    vm = relax.VirtualMachine(tvm.compile(fold_weight_layouts(mod, weights_as_params=True), target), tvm.cpu())
    params = bind_params(tvm, vm, list(facts["params"]), facts["params"], tvm.cpu())
    for length in ((1, 4, 7) if dynamic else (T,)):
        feeds = feeds_for(model, length, seed=length)
        out = vm["main"](*[tvm.runtime.tensor(feeds[v.name]) for v in model.graph.input], *params)
        for index, want in enumerate(onnxruntime_outputs(model, feeds)):
            np.testing.assert_allclose(out[index].numpy(), want, atol=2e-6, rtol=1e-5)
