"""OpenVINO: the exported graph converted to an IR (model.xml + model.bin), compiled for the CPU when opened."""

from __future__ import annotations

from typing import Any

from rlopt.backends.base import Backend
from rlopt.backends.openvino.facts import OpenVinoFacts


def _unavailable(facts: OpenVinoFacts) -> str | None:
    from rlopt.backends.openvino.library import openvino_missing

    return openvino_missing()


def _threads(facts: OpenVinoFacts) -> int | str:
    if facts.inference_num_threads:
        return facts.inference_num_threads
    chosen = f", {facts.threads_at_build} when built" if facts.threads_at_build else ""
    return f"OpenVINO default for {facts.performance_hint}{chosen}"


def _one_thread(facts: dict[str, Any]) -> dict[str, Any]:
    """INFERENCE_NUM_THREADS is per compiled model: a runner opened with 1 computes on one thread."""
    return {**facts, "inference_num_threads": 1}


BACKEND = Backend(
    name="openvino", module="openvino",
    runner="rlopt.backends.openvino.runner:OpenVinoRunner",
    unavailable=_unavailable, threads=_threads, facts=OpenVinoFacts, native=True,
    triton_platform=("openvino", "model.xml"), triton_config="rlopt.backends.openvino.triton:triton_config",
    stages=("rlopt.backends.openvino.stages:OpenVinoConvert",),
    refit="rlopt.backends.openvino.refit:refit_artifact", one_thread=_one_thread)
