"""Stage: the ONNX file TensorRT's parser gets: standard ops only, named dynamic dims, folded, and typed.

- Only standard ONNX domains: an ONNX Runtime-optimized graph holds `com.microsoft` ops (FusedGemm)
  that TensorRT cannot parse (shared notes); refused with the reason.
- Every dynamic input dim gets a name, so the optimization profile and the parser agree on it.
- Constants folded and dead nodes removed with onnx-graphsurgeon (what `polygraphy surgeon
  sanitize --fold-constants` does).
- Precision casts: TensorRT 11 is always strongly typed (the FP16 builder flag is gone), so fp16
  must be in the graph. ONNX Runtime's float16 converter writes fp16 weights and compute with
  fp32 inputs and outputs kept (Cast at the edges), so callers and Triton still see fp32.
Runs on CPU; the TensorRT stage calls it after its GPU gate, tests call it directly.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlopt.errors import StageError, first_line, located
from rlopt.lazy import require
from rlopt.onnx_graph import subgraphs, to_fp16
from rlopt.stages.base import StageOutput

STANDARD_DOMAINS = ("", "ai.onnx")


def foreign_ops(model: Any) -> list[str]:
    """'domain::op (node)' for every node outside the standard ONNX domains, subgraphs included."""
    return [f"{node.domain}::{node.op_type} ({node.name or node.output[0]})"
            for graph in subgraphs(model.graph) for node in graph.node if node.domain not in STANDARD_DOMAINS]


def name_dynamic_dims(model: Any) -> list[str]:
    """Give every unnamed dynamic input dim the name '<input>_d<axis>'; returns the names given."""
    initializers = {init.name for init in model.graph.initializer}
    named = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        for axis, dim in enumerate(value.type.tensor_type.shape.dim):
            if not dim.HasField("dim_value") and not dim.dim_param:
                dim.dim_param = f"{value.name}_d{axis}"
                named.append(dim.dim_param)
    return named


def fold_and_clean(model: Any) -> Any:
    """Constant folding, dead-node removal and a topological sort (onnx-graphsurgeon)."""
    gs = require("onnx_graphsurgeon")
    graph = gs.import_onnx(model)
    graph.fold_constants().cleanup().toposort()
    return gs.export_onnx(graph)


def prepare_for_tensorrt(onnx_path: Path, out_path: Path, *, cast_to: str | None, recipe_path: Path,
                         network: str) -> StageOutput:
    """Write the TensorRT-ready ONNX to `out_path`; `cast_to` is 'fp16' when precision must live in the graph."""
    onnx = require("onnx")
    model = onnx.load(str(onnx_path))
    foreign = foreign_ops(model)
    if foreign:
        raise StageError(located(recipe_path, f"networks.{network}", f"the ONNX graph has non-standard ops TensorRT "
                                 f"cannot parse: {', '.join(foreign[:3])}",
                                 "export with the standard opset and never feed an ONNX Runtime-optimized model"))
    nodes_before = sum(1 for _ in model.graph.node)
    named = name_dynamic_dims(model)
    if cast_to == "fp16":
        model = to_fp16(model)
    elif cast_to is not None:
        raise StageError(located(recipe_path, f"networks.{network}.precision", f"{cast_to} casts in the graph are not "
                                 "written by this rlopt", "use fp16 or fp32 for TensorRT 11"))
    try:
        model = fold_and_clean(model)
        onnx.checker.check_model(model, full_check=True)
    except Exception as exc:  # graphsurgeon and the checker raise many types
        first = first_line(exc)
        raise StageError(located(recipe_path, f"networks.{network}", f"preparing the ONNX graph for TensorRT failed "
                                 f"({first})", "drop tensorrt from backends and report the model")) from None
    onnx.save(model, str(out_path))
    facts = {"source": onnx_path.name, "nodes_before": nodes_before, "nodes_after": len(model.graph.node),
             "named_dynamic_dims": named, "precision_in_graph": cast_to or "fp32",
             "io_dtypes": "as exported (fp32 kept at the edges)" if cast_to else "as exported"}
    return StageOutput(out_path, facts)
