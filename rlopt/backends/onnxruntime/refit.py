"""ONNX Runtime's refit hook: the artifact is the refitted graph itself, or its int8 copy quantized again.

The refit driver has already rewritten model.onnx (and re-padded model.padded.onnx) through the weight map;
an int8 artifact is re-quantized from it with the compile's settings, and the refit's gate then checks it
against the reduced-precision gate recorded in its facts.
"""

from __future__ import annotations

import logging

from rlopt.backends.base import RefitInputs
from rlopt.facts import ArtifactFacts
from rlopt.errors import StageError, first_line, located
from rlopt.lazy import require


def refit_artifact(inputs: RefitInputs) -> ArtifactFacts:
    facts = inputs.facts
    rewritten = [p.name for p in (inputs.onnx_path, inputs.padded_onnx_path) if p is not None]
    if inputs.artifact in rewritten:
        return facts
    path = inputs.network_dir / inputs.artifact
    if facts.precision_built != "int8":
        raise StageError(located(path, "onnxruntime", "the artifact is neither the exported graph nor its int8 "
                                 "copy", "recompile the MODEL_DIR"))
    quantization = require("onnxruntime.quantization")
    root = logging.getLogger()
    level = root.level
    root.setLevel(logging.ERROR)  # the quantizer logs a pre-processing hint through the root logger
    try:
        quantization.quantize_dynamic(str(inputs.onnx_path), str(path), weight_type=quantization.QuantType.QInt8,
                                      extra_options={"EnableSubgraph": True})
    except Exception as exc:  # the quantizer raises many types for graphs it cannot handle
        raise StageError(located(path, "int8", f"re-quantizing the refitted graph failed ({first_line(exc)})",
                                 "recompile the MODEL_DIR")) from None
    finally:
        root.setLevel(level)
    return facts
