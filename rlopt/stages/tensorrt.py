"""Stage: TensorRT engine. Gated: no TensorRT object is created unless a GPU and the library are present."""

from __future__ import annotations

from importlib.util import find_spec
from pathlib import Path

from rlopt.errors import BackendUnavailable
from rlopt.machine import gpu_absent_reason
from rlopt.recipe import NetworkSpec, TensorRTConfig
from rlopt.stages.base import StageOutput


def build_engine(onnx_path: Path, config: TensorRTConfig, spec: NetworkSpec, out_dir: Path) -> StageOutput:
    reason = gpu_absent_reason()
    if reason is not None:
        raise BackendUnavailable(f"TensorRT needs an NVIDIA GPU: {reason}")
    if find_spec("tensorrt") is None:
        raise BackendUnavailable("TensorRT needs the 'tensorrt' package (NVIDIA's wheels), not installed here")
    raise BackendUnavailable("building TensorRT engines is not implemented in this rlopt version")
