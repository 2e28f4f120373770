"""TensorRT's refit hook: `trt.Refitter` on the built engine, fed the refitted graph's weights by name.

The ONNX parser names an engine's refittable weights after the initializers of the graph it parsed, which
is the TensorRT-prepared copy of model.onnx (or model.padded.onnx). Preparing the refitted graph the same way
(same folding, same precision casts) gives every weight under the same name. Gated like the build: nothing
of TensorRT is imported without a GPU and the library.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends.base import RefitInputs
from rlopt.backends.tensorrt.facts import TensorRTFacts
from rlopt.errors import BackendUnavailable, StageError, located
from rlopt.lazy import require


def prepared_weights(inputs: RefitInputs, facts: TensorRTFacts) -> dict[str, np.ndarray]:
    """The initializers of the refitted graph after the build's own TensorRT preparation, by name."""
    from rlopt.backends.tensorrt.prepare import prepare_for_tensorrt

    numpy_helper = require("onnx.numpy_helper")
    onnx = require("onnx")
    prepared = facts.prepared or {}
    source = inputs.padded_onnx_path if prepared.get("source") == "model.padded.onnx" else inputs.onnx_path
    if source is None:
        raise StageError(located(inputs.network_dir, "tensorrt", "the engine was built from model.padded.onnx, which "
                                 "this MODEL_DIR no longer has", "recompile the MODEL_DIR"))
    cast = prepared.get("precision_in_graph", "fp32")
    with tempfile.TemporaryDirectory(prefix="rlopt-trt-refit-") as scratch:
        out = prepare_for_tensorrt(source, Path(scratch) / "model.trt.onnx", cast_to=None if cast == "fp32" else cast,
                                   recipe_path=inputs.network_dir, network=inputs.network_dir.name)
        assert out.artifact is not None
        graph = onnx.load(str(out.artifact)).graph
    return {name: numpy_helper.to_array(tensor) for name, tensor in _named_tensors(onnx, graph)}


def _named_tensors(onnx: Any, graph: Any) -> Any:
    """Initializers and Constant values by the name the parser gives their weights, If/Loop bodies included."""
    for init in graph.initializer:
        yield init.name, init
    for node in graph.node:
        for attribute in node.attribute:
            if node.op_type == "Constant" and attribute.type == onnx.AttributeProto.TENSOR:
                yield node.output[0], attribute.t
            if attribute.type == onnx.AttributeProto.GRAPH:
                yield from _named_tensors(onnx, attribute.g)


def refit_artifact(inputs: RefitInputs) -> TensorRTFacts:
    from rlopt.backends.tensorrt.build import tensorrt_unavailable_reason

    facts = TensorRTFacts.of(inputs.facts)
    path = inputs.network_dir / inputs.artifact
    if not facts.refittable:
        raise StageError(located(path, "tensorrt.refittable", "the engine was built without the REFIT flag",
                                 "set tensorrt.refittable: true in the recipe and recompile"))
    reason = tensorrt_unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(reason)
    weights = prepared_weights(inputs, facts)
    trt = require("tensorrt")
    logger = trt.Logger(trt.Logger.WARNING)
    runtime = trt.Runtime(logger)
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise StageError(located(path, "tensorrt", "this TensorRT cannot deserialize the engine", "recompile it here"))
    refitter = trt.Refitter(engine, logger)
    names = list(refitter.get_all_weights())
    unknown = [name for name in names if name not in weights]
    if unknown:
        raise StageError(located(path, "tensorrt", f"the engine's weight '{unknown[0]}' is no initializer of the "
                                 "prepared graph", "recompile the MODEL_DIR"))
    kept = {name: np.ascontiguousarray(weights[name]) for name in names}  # alive until refit_cuda_engine returns
    for name, value in kept.items():
        if not refitter.set_named_weights(name, trt.Weights(value)):
            raise StageError(located(path, "tensorrt", f"TensorRT refused the new '{name}' {list(value.shape)} "
                                     f"{value.dtype}", "recompile the MODEL_DIR"))
    missing = list(refitter.get_missing_weights())
    if missing:
        raise StageError(located(path, "tensorrt", f"weight '{missing[0]}' was not given to the refitter",
                                 "recompile the MODEL_DIR"))
    if not refitter.refit_cuda_engine():
        raise StageError(located(path, "tensorrt", "refit_cuda_engine failed", "recompile the MODEL_DIR"))
    path.write_bytes(bytes(engine.serialize()))
    return facts.updated(refitted_weights=len(kept))
