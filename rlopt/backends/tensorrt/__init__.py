"""TensorRT: engines with optimization profiles, built and run only where an NVIDIA GPU, TensorRT and a CUDA build
of torch are."""

from __future__ import annotations

from rlopt.backends.base import Backend
from rlopt.backends.tensorrt import gate
from rlopt.backends.tensorrt.facts import TensorRTFacts


def _unavailable(facts: TensorRTFacts) -> str | None:
    return gate.unavailable_reason()


BACKEND = Backend(
    name="tensorrt", module="tensorrt",
    runner="rlopt.backends.tensorrt.runner:TensorRTRunner",
    unavailable=_unavailable, threads=lambda facts: "GPU", facts=TensorRTFacts,
    triton_platform=("tensorrt_plan", "model.plan"), native=True,
    stages=("rlopt.backends.tensorrt.stages:TensorRTEngine",),
    refit="rlopt.backends.tensorrt.refit:refit_artifact")
