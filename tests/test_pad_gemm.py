"""GEMM padding: exact under ONNX Runtime, padded dims and skipped edges reported with reasons."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlopt.stages.pad_gemm import exactness, pad_gemm, pad_model, round_up

RNG = np.random.default_rng(0)


def weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(RNG.standard_normal(shape).astype(np.float32), name)


def model_of(nodes: list, initializers: list, out_dim: int, in_dim: int = 16, *, stale_value_info: bool = False,
             outputs: list[str] | None = None) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "mlp", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", "seq", in_dim])],
        [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["batch", "seq", out_dim])
         for name in (outputs or ["out"])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    if stale_value_info:
        model = onnx.shape_inference.infer_shapes(model)
        assert model.graph.value_info
    return model


def linear(name: str, x: str, k: int, n: int, *, bias_first: bool = False) -> tuple[list, list, str]:
    """MatMul + Add(bias), the exporter's 3-D Linear."""
    nodes = [helper.make_node("MatMul", [x, f"{name}.w"], [f"{name}.mm"], name=f"{name}/MatMul")]
    add_inputs = [f"{name}.b", f"{name}.mm"] if bias_first else [f"{name}.mm", f"{name}.b"]
    nodes.append(helper.make_node("Add", add_inputs, [f"{name}.out"], name=f"{name}/Add"))
    return nodes, [weight(f"{name}.w", k, n), weight(f"{name}.b", n)], f"{name}.out"


def mlp(hidden: list[int], activation: str = "Relu", in_dim: int = 16, out_dim: int = 6, **kwargs) -> onnx.ModelProto:
    nodes, inits, x = [], [], "obs"
    dims = [in_dim, *hidden, out_dim]
    for i, (k, n) in enumerate(zip(dims, dims[1:])):
        layer_nodes, layer_inits, x = linear(f"fc{i}", x, k, n, bias_first=bool(i % 2))
        nodes += layer_nodes
        inits += layer_inits
        if i < len(dims) - 2:
            nodes.append(helper.make_node(activation, [x], [f"act{i}"], name=f"act{i}"))
            x = f"act{i}"
    nodes.append(helper.make_node("Identity", [x], ["out"]))
    return model_of(nodes, inits, out_dim, in_dim, **kwargs)


def feeds(in_dim: int = 16) -> list[dict[str, np.ndarray]]:
    return [{"obs": RNG.standard_normal(shape).astype(np.float32)} for shape in ([1, 1, in_dim], [4, 8, in_dim])]


def padded_roundtrip(model: onnx.ModelProto, tmp: Path, multiple: int = 256,
                     **kwargs) -> tuple[dict, float, onnx.ModelProto]:
    onnx.save(model, str(tmp / "model.onnx"))
    in_dim = model.graph.input[0].type.tensor_type.shape.dim[2].dim_value
    out = pad_gemm(tmp / "model.onnx", multiple, tmp / "model.padded.onnx", feeds(in_dim),
                   recipe_path=tmp / "recipe.yaml", network="policy", **kwargs)
    padded = onnx.load(str(out.artifact)) if out.artifact else model
    diff = out.facts["exactness"]["max_abs_diff"] if out.artifact else 0.0
    return out.facts, diff, padded


def shapes(model: onnx.ModelProto) -> dict[str, list[int]]:
    return {init.name: list(init.dims) for init in model.graph.initializer}


def test_round_up() -> None:
    assert [round_up(v, 256) for v in (1, 256, 257, 513, 1000)] == [256, 256, 512, 768, 1024]


def test_hidden_1000_and_513_pad_to_1024_and_768_bit_identical(tmp_path: Path) -> None:
    facts, diff, padded = padded_roundtrip(mlp([1000, 513]), tmp_path)
    assert [(p["from"], p["to"]) for p in facts["padded"]] == [(1000, 1024), (513, 768)]
    sizes = shapes(padded)
    assert sizes["fc0.w__pad16x1024"] == [16, 1024] and sizes["fc0.b__pad1024"] == [1024]
    assert sizes["fc1.w__pad1024x768"] == [1024, 768] and sizes["fc2.w__pad768x6"] == [768, 6]
    assert "fc0.w" not in sizes  # the unpadded originals are gone when nothing else uses them
    assert diff == 0.0 and facts["exactness"]["bit_identical"]
    assert [s["dim"] for s in facts["skipped"]] == [6]
    assert "network output" in facts["skipped"][0]["reason"]
    assert [list(d.dim_value or d.dim_param for d in o.type.tensor_type.shape.dim) for o in padded.graph.output] == \
        [["batch", "seq", 6]]


def test_stale_value_info_is_dropped_and_shapes_inferred_again(tmp_path: Path) -> None:
    facts, diff, padded = padded_roundtrip(mlp([300], stale_value_info=True), tmp_path)
    assert facts["padded"][0]["to"] == 512 and diff == 0.0
    hidden = {v.name: [d.dim_value or d.dim_param for d in v.type.tensor_type.shape.dim]
              for v in padded.graph.value_info}
    assert hidden["fc0.out"] == ["batch", "seq", 512]


@pytest.mark.parametrize("activation", ["Relu", "Tanh", "LeakyRelu", "Gelu"])
def test_zero_preserving_activations_are_padded(activation: str, tmp_path: Path) -> None:
    model = mlp([100], activation)
    if activation == "Gelu":
        model.opset_import[0].version = 20
    facts, diff, _ = padded_roundtrip(model, tmp_path, multiple=64)
    assert [(p["from"], p["to"], p["via"]) for p in facts["padded"]] == [(100, 128, [activation])]
    assert diff == 0.0


def test_decomposed_gelu_region_is_padded(tmp_path: Path) -> None:
    """torch exports GELU at opset 17 as x * 0.5 * (1 + erf(x / sqrt 2)): x feeds two nodes."""
    n1, i1, x = linear("fc0", "obs", 16, 100)
    n2, i2, _ = linear("fc1", "g", 100, 6)
    consts = [numpy_helper.from_array(np.array(v, dtype=np.float32), name)
              for name, v in (("sqrt2", 1.4142135), ("one", 1.0), ("half", 0.5))]
    gelu = [helper.make_node("Div", [x, "sqrt2"], ["d"]), helper.make_node("Erf", ["d"], ["e"]),
            helper.make_node("Add", ["e", "one"], ["a"]), helper.make_node("Mul", [x, "a"], ["m"]),
            helper.make_node("Mul", ["m", "half"], ["g"])]
    model = model_of(n1 + gelu + n2 + [helper.make_node("Identity", ["fc1.out"], ["out"])], i1 + i2 + consts, 6)
    facts, diff, _ = padded_roundtrip(model, tmp_path, multiple=64)
    assert facts["padded"][0]["via"] == ["Div", "Erf", "Add", "Mul", "Mul"] and diff == 0.0


def test_layernorm_softmax_and_sigmoid_edges_are_skipped_with_the_reason(tmp_path: Path) -> None:
    n1, i1, x = linear("fc0", "obs", 16, 100)
    n2, i2, y = linear("fc1", "ln", 100, 100)
    n3, i3, _ = linear("fc2", "sig", 100, 6)
    norm = [helper.make_node("LayerNormalization", [x, "gamma", "beta"], ["ln"], axis=-1, name="norm")]
    sig = [helper.make_node("Sigmoid", [y], ["sig"], name="sig")]
    extra = [numpy_helper.from_array(np.ones(100, np.float32), "gamma"),
             numpy_helper.from_array(np.zeros(100, np.float32), "beta")]
    model = model_of(n1 + norm + n2 + sig + n3 + [helper.make_node("Identity", ["fc2.out"], ["out"])],
                     i1 + i2 + i3 + extra, 6)
    facts = pad_model(model, 64).facts()
    assert facts["padded"] == []
    reasons = {s["layer"].split(" ")[0]: s["reason"] for s in facts["skipped"]}
    assert "LayerNormalization 'norm'" in reasons["fc0/MatMul"]
    assert "maps 0 to 0.5" in reasons["fc1/MatMul"]


def test_gemm_transb_and_a_shared_weight_is_cloned(tmp_path: Path) -> None:
    """Two Gemm layers share one [N, K] weight through transB=1; the second use reads it as [K, N]."""
    w = weight("shared", 100, 100)
    nodes = [
        helper.make_node("Gemm", ["obs2d", "w_in", "b_in"], ["h0"], transB=1, name="in"),
        helper.make_node("Relu", ["h0"], ["r0"]),
        helper.make_node("Gemm", ["r0", "shared", "b_mid"], ["h1"], transB=1, name="mid"),
        helper.make_node("Tanh", ["h1"], ["r1"]),
        helper.make_node("Gemm", ["r1", "shared"], ["h2"], name="mid2"),
        helper.make_node("Relu", ["h2"], ["r2"]),
        helper.make_node("Gemm", ["r2", "w_out", "b_out"], ["out"], transB=1, name="head"),
    ]
    inits = [weight("w_in", 100, 16), weight("b_in", 100), w, weight("b_mid", 100), weight("w_out", 6, 100),
             weight("b_out", 6)]
    graph = helper.make_graph(nodes, "gemm", [helper.make_tensor_value_info("obs2d", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "model.onnx"))
    inputs = [{"obs2d": RNG.standard_normal((b, 16)).astype(np.float32)} for b in (1, 5)]
    out = pad_gemm(tmp_path / "model.onnx", 64, tmp_path / "p.onnx", inputs, recipe_path=tmp_path / "r.yaml",
                   network="n")
    assert [p["edge"] for p in out.facts["padded"]] == ["in -> mid", "mid -> mid2", "mid2 -> head"]
    sizes = shapes(onnx.load(str(out.artifact)))
    assert sizes["shared__pad128x128"] == [128, 128]
    assert sizes["w_in__pad128x16"] == [128, 16] and sizes["w_out__pad6x128"] == [6, 128]
    assert out.facts["exactness"]["max_abs_diff"] == 0.0


def test_transposed_a_and_broadcast_bias_are_refused(tmp_path: Path) -> None:
    nodes = [
        helper.make_node("Gemm", ["obs2d", "w0", "scalar_bias"], ["h0"], name="broadcast"),
        helper.make_node("Relu", ["h0"], ["r0"]),
        helper.make_node("Gemm", ["r0", "w1"], ["out"], name="head"),
    ]
    inits = [weight("w0", 16, 100), numpy_helper.from_array(np.array([0.5], np.float32), "scalar_bias"),
             weight("w1", 100, 6)]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("obs2d", TensorProto.FLOAT, ["batch", 16])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 6])], inits)
    facts = pad_model(helper.make_model(graph), 64).facts()
    assert facts["padded"] == []
    assert "bias C broadcasts" in facts["skipped"][0]["reason"]
    transposed = helper.make_graph(
        [helper.make_node("Gemm", ["x", "w0"], ["h"], name="a", transA=1), helper.make_node("Relu", ["h"], ["out"])],
        "t", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [16, "batch"])],
        [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 100])], [weight("w0", 16, 100)])
    assert pad_model(helper.make_model(transposed), 64).facts()["padded"] == []


def test_pad_outputs_slices_back_to_the_same_shape(tmp_path: Path) -> None:
    facts, diff, padded = padded_roundtrip(mlp([100], out_dim=6), tmp_path, multiple=64, pad_outputs=True)
    assert facts["sliced_outputs"] == [{"layer": "fc1/MatMul", "from": 6, "to": 64, "sliced_back": True}]
    assert "Slice" in [n.op_type for n in padded.graph.node]
    assert diff == 0.0


def test_nothing_to_pad_writes_nothing(tmp_path: Path) -> None:
    facts, _, _ = padded_roundtrip(mlp([256, 512]), tmp_path)
    assert facts["applied"] is False and facts["already_aligned"] == 2
    assert not (tmp_path / "model.padded.onnx").exists()


def test_exactness_reports_a_real_difference(tmp_path: Path) -> None:
    """The check is not vacuous: a model with different weights is reported as such."""
    model = mlp([100])
    onnx.save(model, str(tmp_path / "a.onnx"))
    model.graph.initializer[0].CopyFrom(weight(model.graph.initializer[0].name, 16, 100))
    onnx.save(model, str(tmp_path / "b.onnx"))
    report = exactness(tmp_path / "a.onnx", tmp_path / "b.onnx", feeds())
    assert report["max_abs_diff"] > 0.01 and not report["bit_identical"]


def test_multiple_must_be_positive() -> None:
    with pytest.raises(ValueError):
        pad_model(mlp([100]), 0)
