"""ONNX forms that Relax 0.27's ONNX frontend does not read, rewritten into equivalent forms it does.

The dynamo exporter (torch.onnx.export(dynamo=True), unoptimized so that its graph refits) writes
- small constants as `Constant(value_ints=...)` / `value_float` / ...; the frontend reads only
  `Constant(value=tensor)`;
- a symbolic size as a scalar (`Squeeze(Shape(x, start=1, end=2))`) made 1-D by `Reshape(size, [-1])` before
  it joins a shape; the frontend holds such a scalar as a PrimValue, which its Reshape refuses and its
  Unsqueeze(axis 0) turns into a shape.
What remains that the frontend cannot convert is named (`check_supported`): TVM is skipped with the op.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from rlopt.lazy import require

_SCALAR_FORMS = {"value_int": np.int64, "value_float": np.float32}
_LIST_FORMS = {"value_ints": np.int64, "value_floats": np.float32}


def constants_as_tensors(graph: Any) -> int:
    """Give every `Constant` with a value_int(s) / value_float(s) attribute the same value as a `value` tensor
    (subgraphs included). Returns the count."""
    from onnx import helper, numpy_helper

    count = 0
    for node in graph.node:
        for attribute in node.attribute:
            if attribute.g.node:
                count += constants_as_tensors(attribute.g)
            for sub in attribute.graphs:
                count += constants_as_tensors(sub)
        if node.op_type != "Constant" or len(node.attribute) != 1:
            continue
        attribute = node.attribute[0]
        if attribute.name in _SCALAR_FORMS:
            value = np.array(helper.get_attribute_value(attribute), dtype=_SCALAR_FORMS[attribute.name])
        elif attribute.name in _LIST_FORMS:
            value = np.array(list(helper.get_attribute_value(attribute)), dtype=_LIST_FORMS[attribute.name])
        else:
            continue
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("value", numpy_helper.from_array(value)))
        count += 1
    return count


def _constant_ints(graph: Any) -> dict[str, list[int]]:
    from onnx import numpy_helper

    found = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            found[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return {name: value.reshape(-1).tolist() for name, value in found.items() if value.dtype.kind == "i"}


def scalar_reshapes_as_unsqueeze(model: Any) -> int:
    """`Reshape(s, [-1])` of a rank-0 `s` -> `Unsqueeze(s, [0])` (the same [1] tensor). Returns the count."""
    from onnx import helper, numpy_helper, shape_inference

    graph = model.graph
    constants = _constant_ints(graph)
    candidates = [node for node in graph.node if node.op_type == "Reshape" and constants.get(node.input[1]) == [-1]]
    if not candidates:
        return 0
    try:
        inferred = shape_inference.infer_shapes(model).graph
    except Exception:  # onnx raises its own types on graphs it cannot type: nothing is rewritten then
        return 0
    ranks = {value.name: len(value.type.tensor_type.shape.dim) for value in
             [*inferred.input, *inferred.value_info, *inferred.output] if value.type.tensor_type.HasField("shape")}
    axis = "__rlopt_axis0"
    count = 0
    for node in candidates:
        if ranks.get(node.input[0]) != 0:
            continue
        if count == 0:
            graph.node.insert(0, helper.make_node("Constant", [], [axis],
                                                  value=numpy_helper.from_array(np.array([0], dtype=np.int64))))
        replacement = helper.make_node("Unsqueeze", [node.input[0], axis], list(node.output), name=node.name)
        node.CopyFrom(replacement)
        count += 1
    return count


def unsupported_ops(onnx_model: Any) -> list[str]:
    """'<op> (node <name>)' for each node (subgraphs included) whose default-domain op type Relax's ONNX frontend
    has no converter for (0.27: Loop, Scan, ...; LSTM, GRU and RNN are unrolled before, see
    rlopt.backends.tvm.recurrent), so TVM is skipped with the op named."""
    try:
        frontend = require("tvm.relax.frontend.onnx.onnx_frontend")
        supported = set(frontend._get_convert_map()) | {"If"}  # If is converted by the importer itself
    except Exception:  # a private API that moved: let the import itself report
        return []
    found: dict[str, str] = {}

    def visit(graph: Any) -> None:
        for node in graph.node:
            if node.domain in ("", "ai.onnx") and node.op_type not in supported:
                found.setdefault(node.op_type, node.name or (node.output[0] if node.output else "?"))
            for attribute in node.attribute:
                if attribute.HasField("g"):
                    visit(attribute.g)
                for sub in attribute.graphs:
                    visit(sub)

    visit(onnx_model.graph)
    return [f"{op} (node {name})" for op, name in found.items()]


def check_supported(onnx_model: Any) -> None:
    """BackendUnavailable naming the first op the frontend cannot convert; other backends go on."""
    from rlopt.errors import BackendUnavailable

    missing = unsupported_ops(onnx_model)
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise BackendUnavailable(f"tvm: Relax ONNX frontend has no converter for {missing[0]}{more}")


__all__ = ["check_supported", "constants_as_tensors", "scalar_reshapes_as_unsqueeze", "unsupported_ops"]
