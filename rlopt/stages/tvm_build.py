"""Stage: TVM (Relax, 0.27) library from ONNX, with Linear+activation fused, for the recipe's target.

Two measured traps shape this stage (shared notes, and checked by tests):
- Relax's ONNX frontend cannot compare a symbolic shape scalar (`Gather(Shape(x), 0) > 1`,
  the batch-vs-single branch): `tensorize_shape_comparisons` rewrites that Gather into a
  tensor form the frontend handles.
- A graph with an If imports without dataflow blocks, so nothing fuses, and
  `get_default_pipeline` then miscompiles the If (the VM returns None). `ConvertToDataflow`
  followed by the "zero" pipeline fuses and is exact.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.errors import BackendUnavailable, StageError, located
from rlopt.lazy import require
from rlopt.recipe import TvmConfig
from rlopt.stages.base import StageOutput

COMPARISONS = {"Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"}


def target_slug(target: dict[str, Any]) -> str:
    """`tvm-<slug>.so`: the kind plus what picks the code (mcpu or arch)."""
    parts = [str(target.get("kind", "llvm"))]
    for key in ("mcpu", "arch"):
        if target.get(key):
            parts.append(str(target[key]))
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))


def _constant_values(graph: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def tensorize_shape_comparisons(model: Any) -> int:
    """Rewrite `Gather(Shape(x), scalar)` feeding only comparisons into `Squeeze(Gather(Shape(x), [i]))`.

    Same values, but a tensor instead of a symbolic scalar. Returns the number of rewrites.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    shapes = {out for node in graph.node if node.op_type == "Shape" for out in node.output}
    constants = _constant_values(graph)
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    rewritten: list[Any] = []
    count = 0
    for node in graph.node:
        index = constants.get(node.input[1]) if node.op_type == "Gather" and len(node.input) > 1 else None
        users = consumers.get(node.output[0], []) if node.output else []
        if (index is not None and index.ndim == 0 and node.input[0] in shapes and users
                and all(user.op_type in COMPARISONS for user in users)):
            vector_index, gathered = f"{node.output[0]}__index1d", f"{node.output[0]}__gathered1d"
            rewritten.append(helper.make_node("Constant", [], [vector_index],
                                              value=numpy_helper.from_array(index.reshape(1).astype(index.dtype))))
            rewritten.append(helper.make_node("Gather", [node.input[0], vector_index], [gathered], axis=0))
            rewritten.append(helper.make_node("Squeeze", [gathered], [node.output[0]]))
            count += 1
        else:
            rewritten.append(node)
    del graph.node[:]
    graph.node.extend(rewritten)
    return count


def fused_kernels(mod: Any) -> list[str]:
    return sorted(gv.name_hint for gv in mod.functions if gv.name_hint.startswith("fused_"))


def build_tvm(onnx_path: Path, config: TvmConfig, out_dir: Path, *, recipe_path: Path, network: str) -> StageOutput:
    kind = config.target.get("kind")
    if kind != "llvm":
        raise BackendUnavailable(f"TVM target kind '{kind}' is not built by this rlopt on this machine "
                                 "(only {kind: llvm} is supported here)")
    onnx = require("onnx")
    tvm = require("tvm")
    relax = require("tvm.relax")
    from_onnx = require("tvm.relax.frontend.onnx").from_onnx

    model = onnx.load(str(onnx_path))
    rewrites = tensorize_shape_comparisons(model)
    try:
        target = tvm.target.Target(dict(config.target))
    except Exception as exc:  # tvm raises its own error types for a bad target dict
        raise StageError(located(recipe_path, "tvm.target", f"TVM rejects {config.target} ({str(exc).splitlines()[0]})",
                                 "give a TVM JSON target dict such as {kind: llvm, mcpu: znver4}")) from None
    try:
        mod = from_onnx(model, keep_params_in_input=False)
        mod = relax.transform.ConvertToDataflow(min_size=1)(mod)
        with target:
            mod = relax.get_pipeline("zero")(mod)
        kernels = fused_kernels(mod)
        executable = tvm.compile(mod, target)
    except Exception as exc:  # the TVM frontend and compiler raise many error types
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise StageError(located(recipe_path, f"networks.{network}", f"TVM cannot compile the ONNX model: {first}",
                                 "use operators TVM's Relax ONNX frontend supports, or drop tvm from backends")) from None
    out_path = out_dir / f"tvm-{target_slug(config.target)}.so"
    executable.export_library(str(out_path))
    facts = {"target": dict(config.target), "tuned": False, "fused_kernels": kernels,
             "shape_comparisons_tensorized": rewrites, "pipeline": "ConvertToDataflow + relax 'zero' pipeline",
             "tvm": tvm.__version__}
    return StageOutput(out_path, facts)
