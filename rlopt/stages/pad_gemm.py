"""Stage: zero-pad GEMM hidden dims to a multiple (Tensor Cores want multiples of 64..256), exactly.

For a chain `Linear(N) -> elementwise ops that keep 0 at 0 -> Linear(K = N)`, padding N of the
first weight and its bias, and K of the next weight, with zeros leaves every real output
unchanged: the padded columns hold f(0) = 0 after the activation and meet zero rows of the next
weight. Anything that mixes values across the hidden axis (LayerNorm, Softmax, a reduction) or
does not keep 0 at 0 is left alone and reported with the reason; model inputs and outputs keep
their shapes (a layer that feeds an output is padded only when asked, then sliced back).

Measured traps (shared notes): stale `value_info` breaks shape inference and ONNX Runtime after
padding, so all of it is dropped and inferred again; shared initializers are cloned, never
padded in place; Gemm with transA=1 or a broadcast bias is refused.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.errors import StageError, located
from rlopt.lazy import require
from rlopt.onnx_graph import GraphScope as _Scope, node_attributes as _attrs, subgraphs as _graphs
from rlopt.stages.base import StageOutput

# Elementwise ops a region between two layers may contain, evaluated on numpy to prove f(0) == 0.
_UNARY: dict[str, Any] = {
    "Relu": lambda x, a: np.maximum(x, 0.0),
    "Tanh": lambda x, a: np.tanh(x),
    "LeakyRelu": lambda x, a: np.where(x >= 0, x, x * a.get("alpha", 0.01)),
    "Gelu": lambda x, a: 0.5 * x * (1.0 + np.vectorize(math.erf)(x / math.sqrt(2.0))),
    "Erf": lambda x, a: np.vectorize(math.erf)(x),
    "Identity": lambda x, a: x,
    "Neg": lambda x, a: -x,
    "Sigmoid": lambda x, a: 1.0 / (1.0 + np.exp(-x)),
    "Elu": lambda x, a: np.where(x >= 0, x, a.get("alpha", 1.0) * (np.exp(x) - 1.0)),
    "Selu": lambda x, a: a.get("gamma", 1.0507) * np.where(x > 0, x, a.get("alpha", 1.6733) * (np.exp(x) - 1.0)),
    "Softplus": lambda x, a: np.log1p(np.exp(x)),
}
_BINARY: dict[str, Any] = {
    "Mul": np.multiply,
    "Div": np.divide,
    "Add": np.add,
    "Sub": np.subtract,
}


@dataclass
class _Layer:
    """A MatMul/Gemm with a constant 2-D weight (and an optional bias): the unit that gets padded."""

    graph: Any
    node: Any
    weight: str
    n_axis: int
    k_axis: int
    n: int
    k: int
    output: str
    last_node: Any
    bias: str | None = None
    bias_node: Any = None
    bias_input: int | None = None
    refuse_n: str | None = None

    @property
    def name(self) -> str:
        return self.node.name or self.node.output[0]


@dataclass
class PadReport:
    """What the pass did: padded edges (from -> to) and skipped edges with the reason."""

    multiple: int
    padded: list[dict[str, Any]] = field(default_factory=list)
    sliced_outputs: list[dict[str, Any]] = field(default_factory=list)
    skipped: list[dict[str, Any]] = field(default_factory=list)
    aligned: int = 0

    @property
    def changed(self) -> bool:
        return bool(self.padded or self.sliced_outputs)

    def facts(self) -> dict[str, Any]:
        return {"multiple": self.multiple, "padded": self.padded, "sliced_outputs": self.sliced_outputs,
                "skipped": self.skipped, "already_aligned": self.aligned}


def round_up(value: int, multiple: int) -> int:
    return -(-value // multiple) * multiple


def _find_layers(graph: Any, scope: _Scope, consumers: dict[str, list[tuple[Any, int]]]) -> dict[int, _Layer]:
    """id(node) -> layer, for every MatMul/Gemm in `graph` whose weight is a constant 2-D initializer."""
    layers: dict[int, _Layer] = {}
    for node in graph.node:
        if node.op_type not in ("MatMul", "Gemm") or len(node.input) < 2:
            continue
        shape = scope.shape(node.input[1])
        if shape is None or len(shape) != 2:
            continue
        attrs = _attrs(node) if node.op_type == "Gemm" else {}
        if attrs.get("transA", 0):
            continue  # refused: the A operand is transposed, so the hidden axis is not the last one
        n_axis, k_axis = (0, 1) if attrs.get("transB", 0) else (1, 0)
        layer = _Layer(graph, node, node.input[1], n_axis, k_axis, shape[n_axis], shape[k_axis],
                       node.output[0], node)
        if node.op_type == "Gemm" and len(node.input) > 2 and node.input[2]:
            bias_shape = scope.shape(node.input[2])
            if bias_shape is None:
                layer.refuse_n = "its bias C is not a constant"
            elif bias_shape not in ([layer.n], [1, layer.n]):
                layer.refuse_n = f"its bias C broadcasts (shape {bias_shape}, N = {layer.n})"
            else:
                layer.bias, layer.bias_node, layer.bias_input = node.input[2], node, 2
        elif node.op_type == "MatMul":
            users = consumers.get(node.output[0], [])
            if len(users) == 1 and users[0][0].op_type == "Add" and users[0][1] >= 0:
                add, index = users[0]
                other = add.input[1 - index]
                if scope.shape(other) in ([layer.n], [1, layer.n]):
                    layer.bias, layer.bias_node, layer.bias_input = other, add, 1 - index
                    layer.output, layer.last_node = add.output[0], add
        layers[id(node)] = layer
    return layers


@dataclass
class _Region:
    """The elementwise ops between a layer's output and the next layer's A input."""

    sink: _Layer | None
    ops: list[str]
    reason: str | None = None


def _region(layer: _Layer, layers: dict[int, _Layer], scope: _Scope,
            consumers: dict[str, list[tuple[Any, int]]], graph_outputs: set[str]) -> _Region:
    """Follow `layer.output` through elementwise ops to the single next layer, or say why not."""
    values: dict[str, np.ndarray] = {layer.output: np.zeros((), dtype=np.float64)}
    pending = [layer.output]
    ops: list[Any] = []
    waiting: dict[int, Any] = {}
    sinks: list[tuple[_Layer, str]] = []
    while pending:
        tensor = pending.pop(0)
        if tensor in graph_outputs:
            return _Region(None, [], f"'{tensor}' is a network output (its shape is kept)")
        users = consumers.get(tensor, [])
        if not users:
            return _Region(None, [], f"'{tensor}' is not consumed")
        for node, index in users:
            if index < 0:
                return _Region(None, [], f"'{tensor}' is read inside the subgraph of {node.op_type} '{node.name}'")
            target = layers.get(id(node))
            if target is not None and index == 0:
                sinks.append((target, tensor))
                continue
            if any(node is done for done in ops):
                continue
            value = _evaluate(node, values, scope)
            if value is None:
                what = f"{node.op_type} '{node.name or node.output[0]}'"
                if node.op_type in ("MatMul", "Gemm"):
                    return _Region(None, [], f"{what} takes it as its weight operand or is transposed (transA=1)")
                return _Region(None, [], f"{what} is not an elementwise op that keeps 0 at 0")
            if value is _WAITING:
                waiting[id(node)] = node
                continue
            waiting.pop(id(node), None)
            ops.append(node)
            values[node.output[0]] = value
            pending.append(node.output[0])
    names = [op.op_type for op in ops]
    for node in waiting.values():
        return _Region(None, names, f"{node.op_type} '{node.name or node.output[0]}' mixes in a non-constant operand")
    if len(sinks) != 1:
        return _Region(None, names, f"the output reaches {len(sinks)} layers; exactly one can be padded safely")
    sink, tensor = sinks[0]
    if len(consumers.get(tensor, [])) != 1:
        return _Region(None, names, f"'{tensor}' also feeds other nodes")
    at_zero = float(values[tensor])
    if at_zero != 0.0:
        return _Region(None, names, f"{' -> '.join(names)} maps 0 to {at_zero:.4g} (not 0-preserving)")
    return _Region(sink, names)


_WAITING = np.zeros(0)


def _evaluate(node: Any, values: dict[str, np.ndarray], scope: _Scope) -> np.ndarray | None:
    """f(0) for an elementwise node; None when the node is not allowed; _WAITING until all region inputs are known."""
    if node.op_type in _UNARY and len(node.input) == 1:
        return _UNARY[node.op_type](values[node.input[0]], _attrs(node)) if node.input[0] in values else _WAITING
    if node.op_type in _BINARY and len(node.input) == 2:
        operands = []
        for name in node.input:
            if name in values:
                operands.append(values[name])
            elif name in scope.scalars:
                operands.append(np.float64(scope.scalars[name]))
            else:
                return _WAITING  # another region tensor not computed yet, or a non-constant operand
        if all(name not in values for name in node.input):
            return None
        with np.errstate(all="ignore"):
            return _BINARY[node.op_type](*operands)
    return None


def _padded(array: np.ndarray, axis: int, to: int) -> np.ndarray:
    widths = [(0, 0)] * array.ndim
    widths[axis] = (0, to - array.shape[axis])
    return np.pad(array, widths)


class _Padder:
    """Collects target shapes per (node, input) and writes cloned, padded initializers once."""

    def __init__(self, scope: _Scope) -> None:
        self.scope = scope
        self.targets: dict[tuple[int, int], tuple[Any, dict[int, int]]] = {}
        self.clones: dict[tuple[str, tuple[int, ...]], str] = {}

    def want(self, node: Any, index: int, axis: int, to: int) -> None:
        _, axes = self.targets.setdefault((id(node), index), (node, {}))
        axes[axis] = max(axes.get(axis, 0), to)

    def apply(self) -> None:
        from onnx import numpy_helper

        for (_, index), (node, axes) in self.targets.items():
            name = node.input[index]
            array = self.scope.array(name)
            for axis, to in axes.items():
                axis = axis if axis >= 0 else array.ndim + axis
                array = _padded(array, axis, to)
            key = (name, tuple(array.shape))
            if key not in self.clones:
                graph, _ = self.scope.initializers[name]
                clone = f"{name}__pad{'x'.join(str(d) for d in array.shape)}"
                graph.initializer.append(numpy_helper.from_array(array, clone))
                self.clones[key] = clone
            node.input[index] = self.clones[key]


def _remove_unused_initializers(model: Any) -> None:
    used: set[str] = set()
    for graph in _graphs(model.graph):
        for node in graph.node:
            used.update(node.input)
        used.update(o.name for o in graph.output)
    for graph in _graphs(model.graph):
        keep = [init for init in graph.initializer if init.name in used]
        if len(keep) != len(graph.initializer):
            del graph.initializer[:]
            graph.initializer.extend(keep)


def _slice_back(layer: _Layer, n: int) -> None:
    """Rename the padded layer's output and slice the real columns back under the old name."""
    from onnx import helper, numpy_helper

    graph, original = layer.graph, layer.output
    padded = f"{original}__padded"
    layer.last_node.output[0] = padded
    prefix = f"{original}__slice"
    consts = [numpy_helper.from_array(np.array(v, dtype=np.int64), f"{prefix}_{what}")
              for what, v in (("starts", [0]), ("ends", [n]), ("axes", [-1]))]
    graph.initializer.extend(consts)
    slice_node = helper.make_node("Slice", [padded] + [c.name for c in consts], [original],
                                  name=f"{layer.name}/slice_back")
    position = next(i for i, node in enumerate(graph.node) if node is layer.last_node)
    graph.node.insert(position + 1, slice_node)


def pad_model(model: Any, multiple: int, *, pad_outputs: bool = False) -> PadReport:
    """Pad `model` in place; returns what was padded and what was skipped, with reasons.

    `pad_outputs` (recipe `pad_gemm_outputs`) also pads N of each layer that cannot hand its padding
    on to a next layer but flows into an output (the head, or a layer before a LayerNorm), and
    slices the real columns back right after it: exact by construction, shapes unchanged.
    """
    if multiple < 1:
        raise ValueError("multiple must be >= 1")
    scope = _Scope(model)
    padder = _Padder(scope)
    report = PadReport(multiple)
    to_slice: list[tuple[_Layer, int]] = []
    for graph in list(_graphs(model.graph)):
        consumers = _Scope.consumers(graph)
        layers = _find_layers(graph, scope, consumers)
        outputs = {o.name for o in graph.output}
        for layer in layers.values():
            if layer.n % multiple == 0:
                report.aligned += 1
                continue
            to = round_up(layer.n, multiple)
            region = _region(layer, layers, scope, consumers, outputs)
            where = f"{layer.name} (N={layer.n})"
            if (region.sink is None and pad_outputs and layer.refuse_n is None
                    and _reaches_output(layer.output, consumers, outputs)):
                to_slice.append((layer, layer.n))
                _pad_n(padder, layer, to)
                report.sliced_outputs.append({"layer": layer.name, "from": layer.n, "to": to, "sliced_back": True})
                continue
            if region.sink is None:
                report.skipped.append({"layer": where, "dim": layer.n, "reason": region.reason})
                continue
            if layer.refuse_n is not None:
                report.skipped.append({"layer": where, "dim": layer.n, "reason": f"refused: {layer.refuse_n}"})
                continue
            sink = region.sink
            if sink.k != layer.n:
                report.skipped.append({"layer": where, "dim": layer.n,
                                       "reason": f"next layer {sink.name} has K={sink.k}, not {layer.n}"})
                continue
            _pad_n(padder, layer, to)
            padder.want(sink.node, 1, sink.k_axis, to)
            report.padded.append({"edge": f"{layer.name} -> {sink.name}", "from": layer.n, "to": to,
                                  "weights": [layer.weight, sink.weight] + ([layer.bias] if layer.bias else []),
                                  "via": region.ops})
    padder.apply()
    for layer, n in to_slice:
        _slice_back(layer, n)
    if report.changed:
        for graph in _graphs(model.graph):
            del graph.value_info[:]
        _remove_unused_initializers(model)
    return report


def _reaches_output(tensor: str, consumers: dict[str, list[tuple[Any, int]]], outputs: set[str]) -> bool:
    """Whether `tensor` flows (through any ops) into an output of its graph: the network's last layer."""
    seen, pending = set(), [tensor]
    while pending:
        name = pending.pop()
        if name in outputs:
            return True
        if name in seen:
            continue
        seen.add(name)
        pending.extend(out for node, _ in consumers.get(name, []) for out in node.output)
    return False


def _pad_n(padder: _Padder, layer: _Layer, to: int) -> None:
    padder.want(layer.node, 1, layer.n_axis, to)
    if layer.bias is not None and layer.bias_input is not None:
        padder.want(layer.bias_node, layer.bias_input, -1, to)


def exactness(original: Path, padded: Path, feeds: list[dict[str, np.ndarray]]) -> dict[str, Any]:
    """Run both models under ONNX Runtime on the same feeds: max |diff| over every output (0.0 = bit-identical)."""
    from rlopt.onnx_session import make_session

    sessions = [make_session(p) for p in (original, padded)]
    max_abs = 0.0
    for feed in feeds:
        base, other = (s.run(None, feed) for s in sessions)
        for a, b in zip(base, other):
            if a.shape != b.shape:
                return {"max_abs_diff": float("inf"), "bit_identical": False, "compared": len(feeds),
                        "problem": f"output shape {list(b.shape)} != {list(a.shape)}"}
            diff = np.abs(a.astype(np.float64) - b.astype(np.float64))
            max_abs = max(max_abs, float(np.nan_to_num(diff, nan=np.inf).max(initial=0.0)))
    return {"max_abs_diff": max_abs, "bit_identical": max_abs == 0.0, "compared": len(feeds)}


def pad_gemm(onnx_path: Path, multiple: int, out_path: Path, feeds: list[dict[str, np.ndarray]], *,
             recipe_path: Path, network: str, pad_outputs: bool = False) -> StageOutput:
    """Write `out_path` (model.padded.onnx) when anything was padded; facts list every padded dim and skipped edge.

    Exactness against the unpadded model under ONNX Runtime is measured here on `feeds` (the
    recorded min/opt/max inputs) and reported as `exactness`; the artifact is None when nothing changed.
    """
    onnx = require("onnx")
    model = onnx.load(str(onnx_path))
    report = pad_model(model, multiple, pad_outputs=pad_outputs)
    facts: dict[str, Any] = report.facts()
    if not report.changed:
        facts["applied"] = False
        return StageOutput(None, facts)
    try:
        model = onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # onnx raises InferenceError / ValidationError with long messages
        first = str(exc).strip().splitlines()[0]
        raise StageError(located(recipe_path, "pad_gemm", f"the padded model of '{network}' is invalid ({first})",
                                 "set pad_gemm: 0 for this recipe and report the model")) from None
    onnx.save(model, str(out_path))
    facts["applied"] = True
    facts["exactness"] = exactness(onnx_path, out_path, feeds)
    return StageOutput(out_path, facts)
