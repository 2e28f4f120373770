"""Stage: TensorRT engine (`<network>/model.plan`).

The gate comes first (rlopt.backends.tensorrt.gate): no TensorRT object is created, and `tensorrt` is not even
imported, unless an NVIDIA GPU, the library and a CUDA build of torch are present (the lean runtime segfaults
without a GPU, shared notes). Otherwise BackendUnavailable, which the pipeline records as `skipped` with the reason
while the compile goes on. Then: ONNX prepared for TensorRT (folded, standard ops, precision
casts where TensorRT 11 needs them) -> engine built through the adapter, with the plan's
optimization profiles, progress and time budget.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from rlopt.backends.tensorrt import gate
from rlopt.errors import BackendUnavailable
from rlopt.machine import gpu_identity
from rlopt.stages.base import StageOutput
from rlopt.backends.tensorrt.facts import TensorRTFacts
from rlopt.backends.tensorrt.plan import TensorRTPlan


def tensorrt_unavailable_reason() -> str | None:
    """Why TensorRT cannot build here, checked without importing it (rlopt.backends.tensorrt.gate); None when it can."""
    return gate.unavailable_reason()


def build_engine(onnx_path: Path, plan: TensorRTPlan, out_dir: Path, *, recipe_path: Path, network: str,
                 progress: Callable[[str], None] | None = None) -> StageOutput:
    reason = tensorrt_unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(reason)
    from rlopt.backends.tensorrt.prepare import prepare_for_tensorrt
    from rlopt.backends.tensorrt.adapter import TensorRTAdapter

    adapter = TensorRTAdapter(gate.load_tensorrt(), progress)
    notice = adapter.precision_notice(plan.precision)
    with tempfile.TemporaryDirectory(prefix="rlopt-trt-") as scratch:
        prepared = prepare_for_tensorrt(onnx_path, Path(scratch) / "model.trt.onnx",
                                        cast_to=adapter.graph_casts_for(plan.precision), recipe_path=recipe_path,
                                        network=network)
        assert prepared.artifact is not None
        result = adapter.build(prepared.artifact, plan, out_dir / "model.plan")
    facts = {**plan.facts(), **result.facts, "onnx": onnx_path.name, "prepared": prepared.facts,
             "gpu": gpu_identity()}
    if notice:
        facts["notice"] = notice
    return StageOutput(out_dir / "model.plan", TensorRTFacts(**facts))
