"""Stage: prove the ONNX file opens in ONNX Runtime with exactly the providers asked for.

The CUDA provider's `use_tf32` is on by default in ONNX Runtime: rlopt opens it with `onnxruntime.tf32` (false by
default), so an fp32 artifact computes in fp32, and records the choice for the runner. ONNX Runtime's TensorRT
provider has no such switch; an artifact that uses it is recorded as tf32 and gated like reduced precision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlopt.backends.onnxruntime.facts import CPU_PROVIDER, CUDA_PROVIDER, OnnxRuntimeFacts
from rlopt.backends.onnxruntime.session import with_options
from rlopt.errors import BackendUnavailable, StageError, describe_exception, located
from rlopt.lazy import require
from rlopt.recipe import OnnxRuntimeConfig
from rlopt.stages.base import StageOutput

TENSORRT_PROVIDER = "TensorrtExecutionProvider"
NO_TF32_SWITCH = ("ONNX Runtime's TensorRT provider has no TF32 switch: its fp32 layers may run in TF32, so this "
                  "artifact is gated by verify.reduced_precision")


def gpu_facts(config: OnnxRuntimeConfig) -> dict[str, Any]:
    """The TF32 choice, the precision it implies and the GPU's identity, for a session with a GPU provider."""
    from rlopt.machine import gpu_identity

    if all(provider == CPU_PROVIDER for provider in config.providers):
        return {}
    facts: dict[str, Any] = {"gpu": gpu_identity()}
    if CUDA_PROVIDER in config.providers:
        facts["tf32"] = config.tf32
    if TENSORRT_PROVIDER in config.providers:
        facts.update(precision_built="tf32", notice=NO_TF32_SWITCH)
    elif config.tf32 and CUDA_PROVIDER in config.providers:
        facts["precision_built"] = "tf32"
    return facts


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
    extra = gpu_facts(config)
    options = ort.SessionOptions()
    options.log_severity_level = 3
    providers = with_options(config.providers, OnnxRuntimeFacts.of(
        {"providers": config.providers, "tf32": extra.get("tf32")}).provider_options)
    try:
        session = ort.InferenceSession(str(onnx_path), sess_options=options, providers=providers)
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
                                   "onnxruntime": ort.__version__, **extra})
