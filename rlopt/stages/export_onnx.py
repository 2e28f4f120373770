"""Stage 2: ONNX from the scripted module, so that `if x.size(0) > 1` survives as an If node.

The dynamo exporter specializes such branches silently (see shared notes); the TorchScript-based
exporter keeps them. Dynamic dims are named; one self-contained file; checked by onnx.checker.
"""

from __future__ import annotations

import contextlib
import io
import warnings
from pathlib import Path

from rlopt.errors import StageError, first_line, located
from rlopt.lazy import require
from rlopt.recipe import InputSpec, NetworkSpec
from rlopt.stages.base import StageOutput

EXPORTER = "torch.onnx.export (TorchScript-based, dynamo=False) from the scripted module"


def dynamic_dim_names(inputs: dict[str, InputSpec]) -> dict[str, dict[int, str]]:
    """'batch' for a dynamic dim 0 shared by all inputs with the same range, '<input>_d<axis>' otherwise."""
    batch_ranges = {(spec.dims("min")[0], spec.dims("max")[0]) for spec in inputs.values() if 0 in spec.dynamic_axes}
    shared_batch = len(batch_ranges) == 1
    names: dict[str, dict[int, str]] = {}
    for name, spec in inputs.items():
        axes = {}
        for axis in spec.dynamic_axes:
            axes[axis] = "batch" if axis == 0 and shared_batch else f"{name}_d{axis}"
        names[name] = axes
    return names


def example_inputs(inputs: dict[str, InputSpec], point: str = "opt") -> tuple:
    torch = require("torch")
    tensors = []
    for spec in inputs.values():
        dtype = getattr(torch, spec.dtype)
        shape = spec.dims(point)
        tensors.append(torch.zeros(shape, dtype=dtype) if dtype in (torch.bool, torch.uint8) else
                       torch.ones(shape, dtype=dtype))
    return tuple(tensors)


def export_onnx(ts_path: Path, spec: NetworkSpec, opset: int, out_path: Path, *, recipe_path: Path,
                network: str) -> StageOutput:
    torch = require("torch")
    onnx = require("onnx")
    scripted = torch.jit.load(str(ts_path), map_location="cpu")
    dynamic_axes = {name: axes for name, axes in dynamic_dim_names(spec.inputs).items() if axes}
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            torch.onnx.export(scripted, example_inputs(spec.inputs), str(out_path), dynamo=False,
                              input_names=list(spec.inputs), output_names=list(spec.outputs),
                              dynamic_axes=dynamic_axes, opset_version=opset, do_constant_folding=True)
    except Exception as exc:  # the exporter raises many types for unsupported operators
        first = first_line(exc)
        raise StageError(located(recipe_path, f"networks.{network}", f"ONNX export failed: {first}",
                                 "use operators supported at this opset (recipe onnx.opset)")) from None
    model = onnx.load(str(out_path))
    graph_outputs = [o.name for o in model.graph.output]
    if graph_outputs != list(spec.outputs):
        out_path.unlink()
        raise StageError(located(recipe_path, f"networks.{network}.outputs",
                                 f"the module returns {len(graph_outputs)} outputs, the recipe names {len(spec.outputs)}",
                                 "list one name per returned tensor"))
    onnx.checker.check_model(model, full_check=True)
    op_types = sorted({node.op_type for node in model.graph.node})
    return StageOutput(out_path, {"exporter": EXPORTER, "opset": opset, "nodes": len(model.graph.node),
                                  "op_types": op_types, "dynamic_dims": dynamic_axes, "if_nodes": op_types.count("If")})
