"""OpenVINO: the exported graph converted to an IR (model.xml + model.bin), compiled for the CPU when opened."""

from __future__ import annotations

from rlopt.backends.capability import Backend, TritonModel
from rlopt.backends.openvino.facts import OpenVinoFacts


def _unavailable(facts: OpenVinoFacts) -> str | None:
    from rlopt.backends.openvino.library import openvino_missing

    return openvino_missing()


def _threads(facts: OpenVinoFacts) -> int | str:
    if facts.inference_num_threads:
        return facts.inference_num_threads
    chosen = f", {facts.threads_at_build} when built" if facts.threads_at_build else ""
    return f"OpenVINO default for {facts.performance_hint}{chosen}"


def _one_thread(facts: OpenVinoFacts) -> OpenVinoFacts:
    """INFERENCE_NUM_THREADS is per compiled model: a runner opened with 1 computes on one thread."""
    return facts.updated(inference_num_threads=1)


BACKEND = Backend(
    name="openvino", module="openvino",
    runner="rlopt.backends.openvino.runner:OpenVinoRunner",
    stages=("rlopt.backends.openvino.stages:OpenVinoConvert",),
    unavailable=_unavailable, threads=_threads, facts=OpenVinoFacts, native=True,
    distributions=(("openvino", ("openvino",)),), pads_gemm=lambda config: False,
    triton=TritonModel(backend="openvino", filename="model.xml", rules="rlopt.backends.openvino.triton:triton_config"),
    refit="rlopt.backends.openvino.refit:refit_artifact", one_thread=_one_thread,
    bench_peer=True,  # users compare against it: faster than ONNX Runtime on some actors (issue 33)
    timed_apart=True)  # its pool timed beside the compiling process's other sessions read 1.4x slow
