"""TensorRT: engines with optimization profiles, built and run only where an NVIDIA GPU, TensorRT and a CUDA build
of torch are."""

from __future__ import annotations

from typing import Any

from rlopt.backends.capability import Backend, TritonModel
from rlopt.backends.tensorrt import gate
from rlopt.backends.tensorrt.config import TensorRTConfig
from rlopt.backends.tensorrt.facts import TensorRTFacts


def _unavailable(facts: TensorRTFacts) -> str | None:
    return gate.unavailable_reason()


def _build_unavailable(config: TensorRTConfig) -> str | None:
    return gate.unavailable_reason()


def _upgrade_v1_facts(network: dict[str, Any]) -> dict[str, Any]:
    """Schema 1 kept the network's shape profiles in its `tensorrt_plan` (the rest is in the engine's own facts)."""
    plan = network.pop("tensorrt_plan", None)
    if isinstance(plan, dict) and plan.get("profiles"):
        network.setdefault("profiles", plan["profiles"])
    return {}


BACKEND = Backend(
    name="tensorrt", module="tensorrt",
    runner="rlopt.backends.tensorrt.runner:TensorRTRunner",
    stages=("rlopt.backends.tensorrt.stages:TensorRTEngine",),
    unavailable=_unavailable, threads=lambda facts: "GPU", facts=TensorRTFacts, config=TensorRTConfig,
    # NVIDIA's meta package, or the CUDA-specific wheels that provide the `tensorrt` module without it
    distributions=(("tensorrt", ("tensorrt", "tensorrt-cu13", "tensorrt-cu12", "tensorrt-cu11", "tensorrt-cu13-bindings",
                                 "tensorrt-cu12-bindings", "tensorrt-cu11-bindings")),),
    pads_gemm=lambda config: True, build_unavailable=_build_unavailable, native=True,
    triton=TritonModel(platform="tensorrt_plan", filename="model.plan",
                       rules="rlopt.backends.tensorrt.triton:every_profile_on_the_gpu"),
    refit="rlopt.backends.tensorrt.refit:refit_artifact", upgrade_v1_facts=_upgrade_v1_facts)
