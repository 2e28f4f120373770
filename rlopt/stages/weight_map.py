"""Where each state_dict entry lands in the exported ONNX graph, found by construction, and how to rewrite it.

The exporter renames, transposes and folds weights (`fc1.weight` [256, 768] may also appear as an anonymous
initializer `34` [768, 256] used by the MatMul of an If branch). `build_weight_map` compares the graph exported
from the real weights with one exported from distinct sentinel weights: a tensor equal in both does not depend
on the weights; any other must equal one sentinel entry as is, reshaped or transposed, else it is listed as
unexplained and refit refuses the network. `apply_weight_map` writes new weights through the recorded map.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np

from rlopt.lazy import require

MAP_VERSION = 1
TRANSFORMS = ("identity", "reshape", "transpose")


def _tensors(graph: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """(location, TensorProto) of every initializer and Constant value, inside If/Loop bodies too."""
    onnx = require("onnx")
    for init in graph.initializer:
        yield f"{prefix}init:{init.name}", init
    for index, node in enumerate(graph.node):
        for attribute in node.attribute:
            if node.op_type == "Constant" and attribute.type == onnx.AttributeProto.TENSOR:
                yield f"{prefix}const:{node.output[0]}", attribute.t
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _tensors(attribute.g, f"{prefix}{index}.{attribute.name}/")
            for number, sub in enumerate(attribute.graphs):
                yield from _tensors(sub, f"{prefix}{index}.{attribute.name}.{number}/")


def tensor_locations(model: Any) -> dict[str, Any]:
    return dict(_tensors(model.graph))


def _structure(model: Any) -> list[tuple[str, ...]]:
    """Op types and wiring of every node, in order, subgraphs included: equal for two exports of one graph."""
    onnx = require("onnx")
    rows: list[tuple[str, ...]] = []

    def visit(graph: Any) -> None:
        for node in graph.node:
            rows.append((node.op_type, *node.input, "->", *node.output))
            for attribute in node.attribute:
                if attribute.type == onnx.AttributeProto.GRAPH:
                    visit(attribute.g)
                for sub in attribute.graphs:
                    visit(sub)

    visit(model.graph)
    return rows


def sentinel_state(state: dict[str, Any], seed: int = 0) -> dict[str, Any]:
    """Distinct random values for every floating-point entry (same shapes and dtypes); others kept."""
    torch = require("torch")
    generator = torch.Generator().manual_seed(seed)
    marked = {}
    for key, value in state.items():
        if value.is_floating_point() and value.numel():
            noise = torch.randn(value.shape, generator=generator, dtype=torch.float64) * 0.1 + 0.5
            marked[key] = noise.to(value.dtype)
        else:
            marked[key] = value
    return marked


def _transform(value: np.ndarray, transform: str, shape: tuple[int, ...], dtype: np.dtype) -> np.ndarray:
    if transform == "transpose":
        value = value.T
    return np.ascontiguousarray(value.reshape(shape), dtype=dtype)


def _match(tensor: np.ndarray, candidates: dict[str, np.ndarray]) -> tuple[str, str] | None:
    for key, value in candidates.items():
        if value.size != tensor.size:
            continue
        cast = value.astype(tensor.dtype)
        if cast.shape == tensor.shape and np.array_equal(cast, tensor):
            return key, "identity"
        if np.array_equal(cast.ravel(), tensor.ravel()):
            return key, "reshape"
        if cast.ndim == 2 and cast.T.shape == tensor.shape and np.array_equal(cast.T, tensor):
            return key, "transpose"
    return None


def build_weight_map(plain: Any, marked: Any, marked_state: dict[str, np.ndarray]) -> dict[str, Any]:
    """The map from two exports of one module: `plain` (real weights) and `marked` (`marked_state`, sentinels).

    Returns {version, entries: {location: {key, transform}}, unexplained: [location...]} or {version, refused}
    when the two exports differ in structure (the graph itself depends on the weights).
    """
    numpy_helper = require("onnx.numpy_helper")
    if _structure(plain) != _structure(marked):
        return {"version": MAP_VERSION, "refused": "exporting other weights changed the graph's structure"}
    plain_tensors, marked_tensors = tensor_locations(plain), tensor_locations(marked)
    if plain_tensors.keys() != marked_tensors.keys():
        return {"version": MAP_VERSION, "refused": "exporting other weights changed the graph's tensors"}
    floats = {k: v for k, v in marked_state.items() if v.dtype.kind == "f"}
    entries: dict[str, dict[str, str]] = {}
    unexplained: list[str] = []
    for location, proto in marked_tensors.items():
        value = numpy_helper.to_array(proto)
        original = numpy_helper.to_array(plain_tensors[location])
        if value.shape == original.shape and np.array_equal(value, original):
            continue
        found = _match(value, floats) if value.dtype.kind == "f" else None
        if found is None:
            unexplained.append(location)
        else:
            entries[location] = {"key": found[0], "transform": found[1]}
    return {"version": MAP_VERSION, "entries": entries, "unexplained": unexplained}


def map_problem(weight_map: dict[str, Any] | None) -> str | None:
    """Why a recorded map cannot refit its graph, or None."""
    if not weight_map or weight_map.get("version") != MAP_VERSION:
        return "its ONNX graph has no weight map (built by an older rlopt)"
    if weight_map.get("refused"):
        return f"no weight map could be built: {weight_map['refused']}"
    if weight_map.get("unexplained"):
        first = weight_map["unexplained"][0]
        return (f"ONNX tensor '{first.rsplit(':', 1)[-1]}' depends on the weights but is no state_dict entry, "
                "reshaped or transposed (folded by the exporter)")
    return None


def apply_weight_map(onnx_path: Path, weight_map: dict[str, Any], state: dict[str, np.ndarray]) -> int:
    """Rewrite `onnx_path` in place with `state`'s values at every mapped location; returns how many."""
    onnx = require("onnx")
    numpy_helper = require("onnx.numpy_helper")
    model = onnx.load(str(onnx_path))
    tensors = tensor_locations(model)
    for location, entry in weight_map["entries"].items():
        proto = tensors[location]
        dtype = onnx.helper.tensor_dtype_to_np_dtype(proto.data_type)
        value = _transform(state[entry["key"]], entry["transform"], tuple(proto.dims), dtype)
        proto.CopyFrom(numpy_helper.from_array(value, proto.name))
    onnx.save(model, str(onnx_path))
    return len(weight_map["entries"])


__all__ = ["MAP_VERSION", "TRANSFORMS", "apply_weight_map", "build_weight_map", "map_problem", "sentinel_state",
           "tensor_locations"]
