"""ONNX Runtime: the exported graph in a CPU (or CUDA / TensorRT provider) session; int8 by dynamic quantization."""

from __future__ import annotations

from typing import Any

from rlopt.backends.base import module_missing
from rlopt.backends.capability import Backend, TritonModel
from rlopt.backends.onnxruntime.config import OnnxRuntimeConfig
from rlopt.backends.onnxruntime.facts import CPU_PROVIDER, OnnxRuntimeFacts
from rlopt.machine import gpu_absent_reason


def _unavailable(facts: OnnxRuntimeFacts) -> str | None:
    missing = module_missing("onnxruntime")
    if missing:
        return missing
    wanted = [p for p in facts.providers if p != CPU_PROVIDER]
    if wanted and gpu_absent_reason():
        return f"providers {wanted} need a GPU: {gpu_absent_reason()}"
    return None


def _threads(facts: OnnxRuntimeFacts) -> int | str:
    return facts.intra_op_threads or "ONNX Runtime default (one per physical core)"


def _one_thread(facts: OnnxRuntimeFacts) -> OnnxRuntimeFacts:
    """One session on the calling thread: ONNX Runtime's intra-op pool is per session."""
    return facts.updated(intra_op_threads=1, shape_threads={}, allow_spinning=None)


def _no_spin(facts: OnnxRuntimeFacts) -> OnnxRuntimeFacts:
    """Its intra-op pools (one per thread count the route uses) sleep between calls."""
    return OnnxRuntimeFacts.of(facts).updated(allow_spinning=False)


def _upgrade_v1_facts(network: dict[str, Any]) -> dict[str, Any]:
    from rlopt.backends.onnxruntime.auto import upgrade_v1_facts

    return upgrade_v1_facts(network)


BACKEND = Backend(
    name="onnxruntime", module="onnxruntime",
    runner="rlopt.backends.onnxruntime.runner:OnnxRuntimeRunner",
    stages=("rlopt.backends.onnxruntime.stages:OnnxRuntimeCheck",),
    unavailable=_unavailable, threads=_threads, facts=OnnxRuntimeFacts, config=OnnxRuntimeConfig,
    distributions=(("onnxruntime", ("onnxruntime", "onnxruntime-gpu")),), pads_gemm=lambda config: False,
    triton=TritonModel(platform="onnxruntime_onnx", filename="model.onnx"),
    refit="rlopt.backends.onnxruntime.refit:refit_artifact", one_thread=_one_thread, no_spin=_no_spin,
    # its spinning pool beside this process's other sessions reads slower than a session routed to it alone runs
    timed_apart=True, auto="rlopt.backends.onnxruntime.auto:THREADS",
    # the bench's yardstick: a shape stays on it unless another backend is clearly faster there
    holds_ties=True,
    upgrade_v1_facts=_upgrade_v1_facts)
