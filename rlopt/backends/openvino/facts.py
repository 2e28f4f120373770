"""What the OpenVINO build records (artifact facts of backend `openvino`) and its runner reads back."""

from __future__ import annotations

from pydantic import Field

from rlopt.facts import ArtifactFacts
from rlopt.files import FileRecord

# OpenVINO's INFERENCE_PRECISION_HINT per precision a recipe can ask for (int8 needs NNCF: not built)
HINTS = {"fp32": "f32", "fp16": "f16", "bf16": "bf16"}
# the OPTIMIZATION_CAPABILITIES entry a CPU must list for each reduced precision
CAPABILITIES = {"fp16": "FP16", "bf16": "BF16"}


class OpenVinoFacts(ArtifactFacts):
    """An OpenVINO IR: `model.xml` (the artifact) and the weights file beside it, compiled for the CPU at load."""

    onnx: str | None = Field(None, description="the ONNX file converted (model.onnx or model.padded.onnx)")
    weights: FileRecord | None = Field(None, description="model.bin, the IR's weights: loaded and checked with it")
    input_bounds: dict[str, list[list[int]]] = Field(
        default_factory=dict, description="input -> [lo, hi] per dim: the partial shape the IR was converted with")
    device: str = Field("CPU", description="the OpenVINO device the runner compiles for")
    performance_hint: str = Field("LATENCY", description="OpenVINO's PERFORMANCE_HINT (one stream on one socket)")
    inference_precision: str = Field(
        "f32", description="OpenVINO's INFERENCE_PRECISION_HINT: f32, or f16 / bf16 where the CPU has them")
    inference_num_threads: int | None = Field(
        None, description="INFERENCE_NUM_THREADS (absent: OpenVINO's choice for the hint, see threads_at_build)")
    threads_at_build: int | None = Field(None, description="the threads OpenVINO chose when the build compiled it")
    openvino: str | None = Field(None, description="the OpenVINO version that converted the IR")

    def companion_files(self) -> list[FileRecord]:
        return [self.weights] if self.weights is not None else []


__all__ = ["CAPABILITIES", "HINTS", "OpenVinoFacts"]
