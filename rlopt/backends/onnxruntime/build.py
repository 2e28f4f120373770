"""Stage: prove the ONNX file opens in ONNX Runtime with exactly the providers asked for."""

from __future__ import annotations

from pathlib import Path

from rlopt.errors import BackendUnavailable, StageError, describe_exception, located
from rlopt.lazy import require
from rlopt.recipe import OnnxRuntimeConfig
from rlopt.stages.base import StageOutput


def check_onnxruntime(onnx_path: Path, config: OnnxRuntimeConfig, *, recipe_path: Path | None = None,
                      network: str = "") -> StageOutput:
    """ONNX Runtime opens the file with exactly `config.providers`; a file it cannot open is this backend's build
    failure, in one line naming the network (the other backends go on)."""
    ort = require("onnxruntime")
    available = ort.get_available_providers()
    missing = [p for p in config.providers if p not in available]
    if missing:
        raise BackendUnavailable(f"ONNX Runtime here has providers {available}, not {missing} "
                                 f"(onnxruntime {ort.__version__}); never falling back silently")
    options = ort.SessionOptions()
    options.log_severity_level = 3
    try:
        session = ort.InferenceSession(str(onnx_path), sess_options=options, providers=config.providers)
    except Exception as exc:  # onnxruntime's Fail, InvalidGraph, NotImplemented, ... (not one base class)
        raise StageError(located(recipe_path or onnx_path, f"networks.{network}" if network else "",
                                 f"ONNX Runtime {ort.__version__} cannot open {onnx_path.name}: "
                                 f"{describe_exception(exc)}", "use operators ONNX Runtime implements at the recipe's "
                                 "opset, or drop onnxruntime from backends")) from None
    got = session.get_providers()
    if any(p not in got for p in config.providers):
        raise BackendUnavailable(f"ONNX Runtime session has providers {got}, not {config.providers}; "
                                 "never falling back silently")
    return StageOutput(onnx_path, {"providers": list(config.providers), "graph_optimization": "ORT_ENABLE_ALL",
                                   "onnxruntime": ort.__version__})
