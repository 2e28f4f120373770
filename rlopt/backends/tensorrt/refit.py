"""TensorRT's refit hook: `trt.OnnxParserRefitter` reads the refitted graph and sets every weight the engine holds.

The ONNX parser names an engine's refittable weights after the graph it parsed, which is the TensorRT-prepared copy
of model.onnx (or model.padded.onnx), including weights it folded itself; `OnnxParserRefitter` knows those names.
Preparing the refitted graph the same way (same folding, same precision casts) and handing the file to it refits
every weight. The refit driver then runs the refitted engine through the parity gate, which catches a refit that
leaves a weight behind (TensorRT 11.3 was reported to drop biases on REFIT). Gated like the build: nothing of
TensorRT is imported without a GPU, the library and a CUDA build of torch.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from rlopt.backends.base import RefitInputs
from rlopt.backends.tensorrt import gate
from rlopt.backends.tensorrt.facts import TensorRTFacts
from rlopt.errors import BackendUnavailable, StageError, located


def prepared_graph(inputs: RefitInputs, facts: TensorRTFacts, scratch: Path) -> Path:
    """The refitted graph after the build's own TensorRT preparation (same source file, folding and casts)."""
    from rlopt.backends.tensorrt.prepare import prepare_for_tensorrt

    prepared = facts.prepared or {}
    source = inputs.padded_onnx_path if prepared.get("source") == "model.padded.onnx" else inputs.onnx_path
    if source is None:
        raise StageError(located(inputs.network_dir, "tensorrt", "the engine was built from model.padded.onnx, which "
                                 "this MODEL_DIR no longer has", "recompile the MODEL_DIR"))
    cast = prepared.get("precision_in_graph", "fp32")
    out = prepare_for_tensorrt(source, scratch / "model.trt.onnx", cast_to=None if cast == "fp32" else cast,
                               recipe_path=inputs.network_dir, network=inputs.network_dir.name)
    assert out.artifact is not None
    return out.artifact


def refit_artifact(inputs: RefitInputs) -> TensorRTFacts:
    facts = TensorRTFacts.of(inputs.facts)
    path = inputs.network_dir / inputs.artifact
    if not facts.refittable:
        raise StageError(located(path, "tensorrt.refittable", "the engine was built without the REFIT flag",
                                 "set tensorrt.refittable: true in the recipe and recompile"))
    reason = gate.unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(reason)
    trt = gate.load_tensorrt()
    logger = trt.Logger(trt.Logger.WARNING)
    runtime = gate.started(trt.Runtime, logger, what="runtime")
    engine = runtime.deserialize_cuda_engine(path.read_bytes())
    if engine is None:
        raise StageError(located(path, "tensorrt", "this TensorRT cannot deserialize the engine", "recompile it here"))
    try:
        refitter = trt.Refitter(engine, logger)
    except TypeError:  # pybind11's answer when TensorRT returns no refitter: the engine is not refittable
        raise StageError(located(path, "tensorrt.refittable", "TensorRT will not refit this engine",
                                 "set tensorrt.refittable: true in the recipe and recompile")) from None
    with tempfile.TemporaryDirectory(prefix="rlopt-trt-refit-") as scratch:
        graph = prepared_graph(inputs, facts, Path(scratch))
        parser_refitter = trt.OnnxParserRefitter(refitter, logger)
        parsed = parser_refitter.refit_from_file(str(graph))
        errors = [str(parser_refitter.get_error(i)) for i in range(parser_refitter.num_errors)]
    missing = list(refitter.get_missing_weights())
    if missing or (not parsed and errors):
        problem = f"weight '{missing[0]}' was not set from the refitted graph" if missing else \
            f"TensorRT's ONNX refitter rejected the refitted graph ({errors[0]})"
        raise StageError(located(path, "tensorrt", problem, "recompile the MODEL_DIR"))
    if not refitter.refit_cuda_engine():
        raise StageError(located(path, "tensorrt", "refit_cuda_engine failed (see the TensorRT log)",
                                 "recompile the MODEL_DIR"))
    data = bytes(engine.serialize())
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_bytes(data)
    os.replace(tmp, path)
    return facts.updated(refitted_weights=len(list(refitter.get_all_weights())), refit="trt.OnnxParserRefitter")
