"""TensorRT: engines with optimization profiles, built and run only where an NVIDIA GPU and TensorRT are."""

from __future__ import annotations

from rlopt.backends.base import Backend, module_missing
from rlopt.backends.tensorrt.facts import TensorRTFacts
from rlopt.machine import gpu_absent_reason


def _unavailable(facts: TensorRTFacts) -> str | None:
    return module_missing("tensorrt") or gpu_absent_reason()


BACKEND = Backend(
    name="tensorrt", module="tensorrt",
    runner="rlopt.backends.tensorrt.runner:TensorRTRunner",
    unavailable=_unavailable, threads=lambda facts: "GPU", facts=TensorRTFacts,
    triton_platform=("tensorrt_plan", "model.plan"), native=True,
    stages=("rlopt.backends.tensorrt.stages:TensorRTEngine",),
    refit="rlopt.backends.tensorrt.refit:refit_artifact")
