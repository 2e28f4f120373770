"""Small ONNX graph helpers shared by stages and backends (no stage or backend imports another for these)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from rlopt.lazy import require


def subgraphs(graph: Any) -> Iterator[Any]:
    """The graph and every subgraph inside it (If/Loop/Scan bodies), depth first."""
    yield graph
    for node in graph.node:
        for attr in node.attribute:
            if attr.g is not None and attr.HasField("g"):
                yield from subgraphs(attr.g)
            for sub in attr.graphs:
                yield from subgraphs(sub)


def subgraph_uses(node: Any) -> set[str]:
    """Every tensor name a node's subgraphs read (outer-scope reads included)."""
    names: set[str] = set()
    for attr in node.attribute:
        subs = ([attr.g] if attr.HasField("g") else []) + list(attr.graphs)
        for sub in subs:
            for graph in subgraphs(sub):
                for inner in graph.node:
                    names.update(n for n in inner.input if n)
                names.update(o.name for o in graph.output)
    return names


class GraphScope:
    """Initializers and constant scalars of the whole model, and the consumers of each graph's tensors."""

    def __init__(self, model: Any) -> None:
        from onnx import numpy_helper

        self.model = model
        self.initializers: dict[str, tuple[Any, Any]] = {}
        self.scalars: dict[str, float] = {}
        for graph in subgraphs(model.graph):
            for init in graph.initializer:
                self.initializers[init.name] = (graph, init)
                if int(np.prod(init.dims)) == 1:
                    self.scalars[init.name] = float(numpy_helper.to_array(init).reshape(()))
            for node in graph.node:
                if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
                    value = numpy_helper.to_array(node.attribute[0].t)
                    if value.size == 1:
                        self.scalars[node.output[0]] = float(value.reshape(()))

    def shape(self, name: str) -> list[int] | None:
        found = self.initializers.get(name)
        return list(found[1].dims) if found else None

    def array(self, name: str) -> np.ndarray:
        from onnx import numpy_helper

        return numpy_helper.to_array(self.initializers[name][1])

    @staticmethod
    def consumers(graph: Any) -> dict[str, list[tuple[Any, int]]]:
        """tensor -> [(node, input index)], with -1 for a read from inside a node's subgraph."""
        found: dict[str, list[tuple[Any, int]]] = {}
        for node in graph.node:
            for index, name in enumerate(node.input):
                if name:
                    found.setdefault(name, []).append((node, index))
            for name in subgraph_uses(node):
                found.setdefault(name, []).append((node, -1))
        return found


def node_attributes(node: Any) -> dict[str, Any]:
    from onnx import helper

    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def to_fp16(model: Any) -> Any:
    """fp16 weights and compute, fp32 graph inputs and outputs (ONNX Runtime's float16 converter).

    The converter appends its edge Casts at the end of the node list; a topological sort follows.
    """
    float16 = require("onnxruntime.transformers.float16")
    gs = require("onnx_graphsurgeon")
    graph = gs.import_onnx(float16.convert_float_to_float16(model, keep_io_types=True))
    graph.toposort()
    return gs.export_onnx(graph)


VALUE_PRESERVING = frozenset({"Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten", "Transpose", "Expand"})


def index_ranges(model: Any) -> dict[str, list[int]]:
    """{integer graph input: [0, rows - 1]} for each input whose values index a table the graph holds as weights
    (Gather's indices, through ops that keep the values): what every backend accepts. ONNX Runtime refuses
    other values, PyTorch's embedding refuses negatives, and TVM's take reads out of bounds."""
    from onnx import helper

    scope = GraphScope(model)
    constant_shapes = {node.output[0]: list(node.attribute[0].t.dims) for graph in subgraphs(model.graph)
                       for node in graph.node if node.op_type == "Constant" and node.attribute
                       and node.attribute[0].name == "value"}
    readers: dict[str, list[tuple[Any, int]]] = {}  # every graph's, If branches included: ids may be read there
    for graph in subgraphs(model.graph):
        for node in graph.node:
            for index, name in enumerate(node.input):
                readers.setdefault(name, []).append((node, index))
    ranges: dict[str, list[int]] = {}
    for graph_input in model.graph.input:
        elem_type = graph_input.type.tensor_type.elem_type
        if not elem_type or helper.tensor_dtype_to_np_dtype(elem_type).kind not in "iu":
            continue
        rows, seen, frontier = [], set(), [graph_input.name]
        while frontier:
            name = frontier.pop()
            for node, index in readers.get(name, []):
                if node.op_type == "Gather" and index == 1:
                    shape = scope.shape(node.input[0]) or constant_shapes.get(node.input[0])
                    axis = int(node_attributes(node).get("axis", 0))
                    if shape and -len(shape) <= axis < len(shape):
                        rows.append(int(shape[axis]))
                elif node.op_type in VALUE_PRESERVING and index == 0 and node.output[0] not in seen:
                    seen.add(node.output[0])
                    frontier.append(node.output[0])
        if rows:
            ranges[graph_input.name] = [0, min(rows) - 1]
    return ranges
