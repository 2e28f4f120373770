"""Stage: prove the ONNX file opens in ONNX Runtime with exactly the providers asked for."""

from __future__ import annotations

from pathlib import Path

from rlopt.errors import BackendUnavailable
from rlopt.lazy import require
from rlopt.backends.onnxruntime.config import OnnxRuntimeConfig
from rlopt.backends.onnxruntime.facts import OnnxRuntimeFacts
from rlopt.stages.base import StageOutput


def check_onnxruntime(onnx_path: Path, config: OnnxRuntimeConfig) -> StageOutput:
    ort = require("onnxruntime")
    available = ort.get_available_providers()
    missing = [p for p in config.providers if p not in available]
    if missing:
        raise BackendUnavailable(f"ONNX Runtime here has providers {available}, not {missing} "
                                 f"(onnxruntime {ort.__version__}); never falling back silently")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(str(onnx_path), sess_options=options, providers=config.providers)
    got = session.get_providers()
    if any(p not in got for p in config.providers):
        raise BackendUnavailable(f"ONNX Runtime session has providers {got}, not {config.providers}; "
                                 "never falling back silently")
    return StageOutput(onnx_path, OnnxRuntimeFacts(providers=list(config.providers), graph_optimization="ORT_ENABLE_ALL",
                                                   onnxruntime=ort.__version__))
