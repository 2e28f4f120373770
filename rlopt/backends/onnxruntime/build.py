"""Stage: prove the ONNX file opens in ONNX Runtime with exactly the providers asked for.

The CUDA provider's `use_tf32` is on by default in ONNX Runtime: rlopt opens it with `onnxruntime.tf32` (false by
default), so an fp32 artifact computes in fp32, and records the choice for the runner. ONNX Runtime's TensorRT
provider has no such switch; an artifact that uses it is recorded as tf32 and gated like reduced precision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlopt.backends.onnxruntime.config import OnnxRuntimeConfig
from rlopt.backends.onnxruntime.facts import CPU_PROVIDER, CUDA_PROVIDER, OnnxRuntimeFacts
from rlopt.errors import BackendUnavailable, StageError
from rlopt.lazy import require
from rlopt.onnx_session import make_session
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


def check_onnxruntime(onnx_path: Path, config: OnnxRuntimeConfig) -> StageOutput:
    ort = require("onnxruntime")
    available = ort.get_available_providers()
    missing = [p for p in config.providers if p not in available]
    if missing:
        raise BackendUnavailable(f"ONNX Runtime here has providers {available}, not {missing} "
                                 f"(onnxruntime {ort.__version__}); never falling back silently")
    facts = OnnxRuntimeFacts(providers=list(config.providers), graph_optimization="ORT_ENABLE_ALL",
                             onnxruntime=ort.__version__, **gpu_facts(config))
    # the session the runner will open: a missing provider is a skip; a graph ONNX Runtime cannot load, a failed build
    make_session(onnx_path, providers=facts.session_providers, provider_options=facts.provider_options,
                 cannot_load=(StageError, "leave onnxruntime out of this recipe's backends"))
    return StageOutput(onnx_path, facts)
