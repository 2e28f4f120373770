"""ONNX LSTM, GRU and RNN nodes as MatMul + gate nodes per step, before import: Relax 0.27's ONNX frontend has no
converter for them.

Each node becomes standard ONNX (MatMul, Add, Slice, Sigmoid, Tanh, Mul, Concat, ...) that the frontend imports
and the "zero" pipeline fuses like an MLP: the input projection of every step in one MatMul, then per step the
recurrent MatMul fused with its adds, and the gates' elementwise math. The weights stay where the exporter put
them (initializers become parameters, Constant nodes fold at build), so the same rewrite serves refit.

Steps are unrolled:
- a static sequence length (every named shape's library, and the dynamic library when the recipe fixes the
  length; an actor that feeds its state back runs one step): exactly that many steps;
- a dynamic length (the dynamic library of a recipe whose length varies): `bounds`' max steps, each step's state
  update kept only where the step is inside the input's length (`Where`), the outputs sliced back to it.

Handled: direction forward / reverse / bidirectional, layout 0 / 1, initial_h / initial_c (absent: zeros), B,
P (LSTM peepholes), clip, input_forget, linear_before_reset 0 / 1 (torch exports 1), activations Sigmoid / Tanh /
Relu. Refused with the reason (TVM is skipped, the other backends go on): sequence_lens, other activations.
Gate orders: ONNX LSTM is i, o, f, c; GRU is z, r, h.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

RECURRENT_OPS = ("LSTM", "GRU", "RNN")
GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}
DEFAULT_ACTIVATIONS = {"LSTM": ["Sigmoid", "Tanh", "Tanh"], "GRU": ["Sigmoid", "Tanh"], "RNN": ["Tanh"]}
ACTIVATIONS = ("Sigmoid", "Tanh", "Relu")
Shapes = dict[str, list[int]]


def _unsupported(node: Any, problem: str) -> Exception:
    from rlopt.errors import BackendUnavailable

    return BackendUnavailable(f"tvm: {node.op_type} node {node.name or node.output[0]}: {problem}")


@dataclass
class Cell:
    """One node's attributes, checked."""

    op: str
    hidden: int
    directions: list[str]  # "forward" / "reverse", one per ONNX direction index
    activations: list[list[str]]  # per direction
    layout: int
    clip: float | None
    input_forget: bool
    linear_before_reset: bool

    @classmethod
    def of(cls, node: Any) -> Cell:
        from onnx import helper

        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        direction = attrs.get("direction", b"forward")
        direction = direction.decode() if isinstance(direction, bytes) else direction
        if direction not in ("forward", "reverse", "bidirectional"):
            raise _unsupported(node, f"direction '{direction}' is not forward, reverse or bidirectional")
        directions = ["forward", "reverse"] if direction == "bidirectional" else [direction]
        per = len(DEFAULT_ACTIVATIONS[node.op_type])
        names = [a.decode() if isinstance(a, bytes) else a for a in attrs.get("activations", [])]
        names = names or DEFAULT_ACTIVATIONS[node.op_type] * len(directions)
        if len(names) != per * len(directions) or any(n not in ACTIVATIONS for n in names):
            raise _unsupported(node, f"activations {names} are not supported (only {', '.join(ACTIVATIONS)})")
        if attrs.get("activation_alpha") or attrs.get("activation_beta"):
            raise _unsupported(node, "activation_alpha / activation_beta are not supported")
        if len(node.input) > 4 and node.input[4]:
            raise _unsupported(node, "a sequence_lens input is not supported (export without packed sequences)")
        if "hidden_size" not in attrs:
            raise _unsupported(node, "no hidden_size attribute")
        return cls(node.op_type, int(attrs["hidden_size"]), directions,
                   [names[i * per:(i + 1) * per] for i in range(len(directions))], int(attrs.get("layout", 0)),
                   float(attrs["clip"]) if "clip" in attrs else None, bool(attrs.get("input_forget", 0)),
                   bool(attrs.get("linear_before_reset", 0)))


class Builder:
    """Appends ONNX nodes with names unique under `prefix`."""

    def __init__(self, prefix: str) -> None:
        self.prefix, self.nodes, self.count = prefix, [], 0

    def op(self, op_type: str, inputs: list[str], outputs: int = 1, name: str | None = None, **attrs: Any) -> Any:
        from onnx import helper

        self.count += 1
        names = [name] if name else [f"{self.prefix}/{op_type}_{self.count}_{i}" for i in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, names, name=f"{self.prefix}/{op_type}_{self.count}",
                                           **attrs))
        return names[0] if outputs == 1 else names

    def const(self, array: np.ndarray) -> str:
        from onnx import numpy_helper

        return self.op("Constant", [], value=numpy_helper.from_array(np.asarray(array)))

    def ints(self, *values: int) -> str:
        return self.const(np.array(values, dtype=np.int64))

    def slice(self, value: str, start: int, end: int, axis: int = -1) -> str:
        return self.op("Slice", [value, self.ints(start), self.ints(end), self.ints(axis)])

    def pick(self, value: str, index: int) -> str:
        """value[index] along axis 0. Slice + Squeeze, not Gather: the frontend turns a Gather's constant index
        into index arithmetic that FoldConstant then builds with LLVM, ~40 ms a kernel, at every import."""
        return self.op("Squeeze", [self.slice(value, index, index + 1, 0), self.ints(0)])

    def activation(self, name: str, value: str, clip: float | None = None) -> str:
        if clip is not None:
            value = self.op("Clip", [value, self.const(np.float32(-clip)), self.const(np.float32(clip))])
        return self.op(name, [value])


@dataclass
class Steps:
    """How to unroll one node: `count` steps; `masked` when the input's length varies (count is its max)."""

    count: int
    masked: bool = False


def _seq_lengths(model: Any, shapes: Shapes | None) -> dict[str, int | None]:
    """Sequence length of every recurrent node's X (by node output name), by ONNX shape inference at `shapes`
    (symbolic when None): an int where known, else None."""
    import onnx
    from onnx import shape_inference

    probe = onnx.ModelProto()
    probe.CopyFrom(model)
    del probe.graph.value_info[:]  # the exporter's symbolic value_info would clash with static dims
    if shapes:
        for value in probe.graph.input:
            if value.name in shapes:
                dims = value.type.tensor_type.shape.dim
                for dim, size in zip(dims, shapes[value.name]):
                    dim.Clear()
                    dim.dim_value = int(size)
    try:
        inferred = shape_inference.infer_shapes(probe, data_prop=True).graph
    except Exception:  # onnx raises its own types on graphs it cannot type
        inferred = probe.graph
    known = {v.name: v.type.tensor_type.shape.dim for v in [*inferred.input, *inferred.value_info]
             if v.type.tensor_type.HasField("shape")}
    lengths: dict[str, int | None] = {}
    for node in model.graph.node:
        if node.op_type in RECURRENT_OPS:
            layout = next((a.i for a in node.attribute if a.name == "layout"), 0)
            dims = known.get(node.input[0])
            dim = dims[1 if layout else 0] if dims is not None and len(dims) == 3 else None
            lengths[node.output[0] or node.name] = dim.dim_value if dim is not None and dim.HasField("dim_value") \
                else None
    return lengths


def plan_steps(model: Any, shapes: Shapes | None, bounds: tuple[Shapes, Shapes] | None) -> dict[str, Steps | None]:
    """Steps per recurrent node (keyed like `_seq_lengths`); None where the length is dynamic and unbounded."""
    if shapes is not None:
        exact = _seq_lengths(model, shapes)
        return {key: Steps(length) if length else None for key, length in exact.items()}
    symbolic = _seq_lengths(model, None)
    low, high = (_seq_lengths(model, bounds[0]), _seq_lengths(model, bounds[1])) if bounds else ({}, {})
    plan: dict[str, Steps | None] = {}
    for key, length in symbolic.items():
        if length:
            plan[key] = Steps(length)
        elif low.get(key) and low.get(key) == high.get(key):
            plan[key] = Steps(int(low[key]))
        elif high.get(key):
            plan[key] = Steps(int(high[key]), masked=True)
        else:
            plan[key] = None
    return plan


def expand_recurrent(model: Any, shapes: Shapes | None = None,
                     bounds: tuple[Shapes, Shapes] | None = None) -> int:
    """Replace every top-level LSTM / GRU / RNN node of `model` (in place) by per-step nodes. `shapes`: the
    static input shapes of this import; else `bounds` (min, max input shapes) size a dynamic length. A node
    whose length is dynamic and unbounded is left as it is. Returns the number of nodes replaced."""
    graph = model.graph
    if not any(node.op_type in RECURRENT_OPS for node in graph.node):
        return 0
    plan = plan_steps(model, shapes, bounds)
    rewritten, count = [], 0
    for index, node in enumerate(graph.node):
        steps = plan.get(node.output[0] or node.name) if node.op_type in RECURRENT_OPS else None
        if steps is None:
            rewritten.append(node)
            continue
        builder = Builder(f"{node.name or node.op_type}__unrolled{index}")
        _expand(builder, node, Cell.of(node), steps)
        rewritten.extend(builder.nodes)
        count += 1
    del graph.node[:]
    graph.node.extend(rewritten)
    return count


def _input(node: Any, index: int) -> str | None:
    return node.input[index] if len(node.input) > index and node.input[index] else None


def _expand(g: Builder, node: Any, cell: Cell, steps: Steps) -> None:
    hidden, gates = cell.hidden, GATES[cell.op]
    x = node.input[0] if cell.layout == 0 else g.op("Transpose", [node.input[0]], perm=[1, 0, 2])  # [T, B, I]
    states = {}
    for slot, index in (("h", 5), ("c", 6)):
        given = _input(node, index)
        if given is not None and cell.layout == 1:
            given = g.op("Transpose", [given], perm=[1, 0, 2])  # [D, B, H]
        states[slot] = given
    length = last = None
    if steps.masked:
        length = g.op("Cast", [g.slice(g.op("Shape", [x]), 0, 1, 0)], to=7)  # the length, an int64 [1] tensor
        last = g.op("Sub", [length, g.ints(1)])
    outputs: dict[str, list[str]] = {"y": [], "h": [], "c": []}
    for d, direction in enumerate(cell.directions):
        weights = _direction_weights(g, node, cell, d, gates, hidden)
        projected = g.op("MatMul", [x, weights["w"]])  # every step's input projection at once: [T, B, G*H]
        if weights["x_bias"] is not None:
            projected = g.op("Add", [projected, weights["x_bias"]])
        h = g.pick(states["h"], d) if states["h"] else None
        c = g.pick(states["c"], d) if states["c"] else None
        order = range(steps.count) if direction == "forward" else range(steps.count - 1, -1, -1)
        per_step: dict[int, str] = {}
        for t in order:
            if steps.masked:
                x_t = g.op("Squeeze", [g.op("Gather", [projected, g.op("Min", [g.ints(t), last])], axis=0),
                                       g.ints(0)])
            else:
                x_t = g.pick(projected, t)
            new_h, new_c = _step(g, cell, d, x_t, h, c, weights)
            if steps.masked:
                inside = g.op("Less", [g.ints(t), length])
                new_h = g.op("Where", [inside, new_h, h or g.const(np.float32(0))])
                if new_c is not None:
                    new_c = g.op("Where", [inside, new_c, c or g.const(np.float32(0))])
            h, c = new_h, new_c
            per_step[t] = h
        assert h is not None
        outputs["y"].append(g.op("Concat", [g.op("Unsqueeze", [per_step[t], g.ints(0, 1)])
                                            for t in range(steps.count)], axis=0))  # [T, 1, B, H]
        outputs["h"].append(g.op("Unsqueeze", [h, g.ints(0)]))
        if c is not None:
            outputs["c"].append(g.op("Unsqueeze", [c, g.ints(0)]))
    _write_outputs(g, node, cell, steps, outputs, x)


def _write_outputs(g: Builder, node: Any, cell: Cell, steps: Steps, outputs: dict[str, list[str]], x: str) -> None:
    """Y [T, D, B, H] (layout 1: [B, T, D, H]), Y_h and Y_c [D, B, H] (layout 1: [B, D, H]) under the node's names."""
    for index, key in enumerate(("y", "h", "c")):
        name = _input_output(node, index)
        if name is None:
            continue
        parts = outputs[key]
        value = parts[0] if len(parts) == 1 else g.op("Concat", parts, axis=1 if key == "y" else 0)
        if key == "y" and steps.masked:  # back to the input's own length
            value = g.op("Slice", [value, g.ints(0), g.op("Slice", [g.op("Shape", [x]), g.ints(0), g.ints(1)]),
                                   g.ints(0)])
        if cell.layout == 1:
            value = g.op("Transpose", [value], perm=[2, 0, 1, 3] if key == "y" else [1, 0, 2])
        g.op("Identity", [value], name=name)


def _input_output(node: Any, index: int) -> str | None:
    return node.output[index] if len(node.output) > index and node.output[index] else None


def _direction_weights(g: Builder, node: Any, cell: Cell, d: int, gates: int, hidden: int) -> dict[str, Any]:
    """W^T [I, G*H] and R^T [H, G*H] of direction `d`, the bias added to the input projection, the bias kept on
    the recurrent side (GRU's h gate with linear_before_reset), and LSTM peepholes."""
    def pick(value: str) -> str:
        return g.pick(value, d)

    width = gates * hidden
    weights: dict[str, Any] = {"w": g.op("Transpose", [pick(node.input[1])], perm=[1, 0]),
                               "r": g.op("Transpose", [pick(node.input[2])], perm=[1, 0]),
                               "x_bias": None, "r_bias": None, "peep": None}
    bias = _input(node, 3)
    if bias is not None:
        both = pick(bias)  # [2 * G * H]: Wb then Rb
        wb, rb = g.slice(both, 0, width), g.slice(both, width, 2 * width)
        if cell.op == "GRU" and cell.linear_before_reset:
            weights["x_bias"], weights["r_bias"] = wb, rb  # r multiplies (h R_h^T + Rb_h): Rb stays on that side
        else:
            weights["x_bias"] = g.op("Add", [wb, rb])
    if cell.op == "GRU" and not cell.linear_before_reset:
        r_all = weights["r"]
        weights["r"], weights["r_h"] = g.slice(r_all, 0, 2 * hidden), g.slice(r_all, 2 * hidden, 3 * hidden)
    if cell.op == "LSTM" and _input(node, 7) is not None:
        peep = pick(node.input[7])  # [3H]: i, o, f
        weights["peep"] = [g.slice(peep, k * hidden, (k + 1) * hidden) for k in range(3)]
    return weights


def _recurrent(g: Builder, h: str | None, r: str, bias: str | None) -> str | None:
    """h @ R^T (+ bias); None for a zero state without a bias."""
    if h is None:
        return bias
    product = g.op("MatMul", [h, r])
    return g.op("Add", [product, bias]) if bias is not None else product


def _step(g: Builder, cell: Cell, d: int, x_t: str, h: str | None, c: str | None,
          weights: dict[str, Any]) -> tuple[str, str | None]:
    """One step of direction `d`: the next h (and c for LSTM). A None state is zeros."""
    acts, hidden, clip = cell.activations[d], cell.hidden, cell.clip
    if cell.op == "RNN":
        pre = _add(g, x_t, _recurrent(g, h, weights["r"], None))
        return g.activation(acts[0], pre, clip), None
    if cell.op == "GRU":
        return _gru_step(g, cell, acts, x_t, h, weights), None
    pre = _add(g, x_t, _recurrent(g, h, weights["r"], None))
    i, o, f, z = (g.slice(pre, k * hidden, (k + 1) * hidden) for k in range(4))
    peep = weights["peep"]
    if peep is not None and c is not None:
        i = g.op("Add", [i, g.op("Mul", [peep[0], c])])
        f = g.op("Add", [f, g.op("Mul", [peep[2], c])])
    i = g.activation(acts[0], i, clip)
    f = g.op("Sub", [g.const(np.float32(1)), i]) if cell.input_forget else g.activation(acts[0], f, clip)
    new_c = g.op("Mul", [i, g.activation(acts[1], z, clip)])
    if c is not None:
        new_c = g.op("Add", [g.op("Mul", [f, c]), new_c])
    if peep is not None:
        o = g.op("Add", [o, g.op("Mul", [peep[1], new_c])])
    o = g.activation(acts[0], o, clip)
    return g.op("Mul", [o, g.activation(acts[2], new_c)]), new_c


def _gru_step(g: Builder, cell: Cell, acts: list[str], x_t: str, h: str | None, weights: dict[str, Any]) -> str:
    hidden, clip = cell.hidden, cell.clip
    xz, xr, xh = (g.slice(x_t, k * hidden, (k + 1) * hidden) for k in range(3))
    hr = _recurrent(g, h, weights["r"], weights["r_bias"])  # [B, 3H] (linear_before_reset: [B, 2H] without)
    hz = g.slice(hr, 0, hidden) if hr is not None else None
    hrr = g.slice(hr, hidden, 2 * hidden) if hr is not None else None
    z = g.activation(acts[0], _add(g, xz, hz), clip)
    r = g.activation(acts[0], _add(g, xr, hrr), clip)
    if cell.linear_before_reset:
        hh = g.slice(hr, 2 * hidden, 3 * hidden) if hr is not None else None
        candidate = _add(g, xh, g.op("Mul", [r, hh]) if hh is not None else None)
    else:
        candidate = _add(g, xh, g.op("MatMul", [g.op("Mul", [r, h]), weights["r_h"]]) if h is not None else None)
    candidate = g.activation(acts[1], candidate, clip)
    if h is None:  # (1 - z) * candidate
        return g.op("Sub", [candidate, g.op("Mul", [z, candidate])])
    return g.op("Add", [candidate, g.op("Mul", [z, g.op("Sub", [h, candidate])])])


def _add(g: Builder, a: str, b: str | None) -> str:
    return a if b is None else g.op("Add", [a, b])


__all__ = ["RECURRENT_OPS", "expand_recurrent", "plan_steps"]
