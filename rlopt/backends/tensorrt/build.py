"""Stage: TensorRT engine (`<network>/model.plan`).

The gate comes first: no TensorRT object is created, and `tensorrt` is not even imported, unless
an NVIDIA GPU and the library are present (the lean runtime segfaults without a GPU, shared
notes). Otherwise BackendUnavailable, which the pipeline records as `skipped` with the reason
while the compile goes on. Then: ONNX prepared for TensorRT (folded, standard ops, precision
casts where TensorRT 11 needs them) -> engine built through the adapter, with the plan's
optimization profiles, progress and time budget.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Callable

from rlopt.errors import BackendUnavailable
from rlopt.lazy import require
from rlopt.stages.base import StageOutput
from rlopt.backends.tensorrt.availability import tensorrt_unavailable_reason
from rlopt.backends.tensorrt.facts import TensorRTFacts
from rlopt.backends.tensorrt.plan import TensorRTPlan


def build_engine(onnx_path: Path, plan: TensorRTPlan, out_dir: Path, *, recipe_path: Path, network: str,
                 progress: Callable[[str], None] | None = None) -> StageOutput:
    reason = tensorrt_unavailable_reason()
    if reason is not None:
        raise BackendUnavailable(reason)
    from rlopt.backends.tensorrt.prepare import prepare_for_tensorrt
    from rlopt.backends.tensorrt.adapter import TensorRTAdapter

    adapter = TensorRTAdapter(require("tensorrt"), progress)
    notice = adapter.precision_notice(plan.precision)
    with tempfile.TemporaryDirectory(prefix="rlopt-trt-") as scratch:
        prepared = prepare_for_tensorrt(onnx_path, Path(scratch) / "model.trt.onnx",
                                        cast_to=adapter.graph_casts_for(plan.precision), recipe_path=recipe_path,
                                        network=network)
        assert prepared.artifact is not None
        result = adapter.build(prepared.artifact, plan, out_dir / "model.plan")
    facts = {**plan.facts(), **result.facts, "onnx": onnx_path.name, "prepared": prepared.facts}
    if notice:
        facts["notice"] = notice
    return StageOutput(out_dir / "model.plan", TensorRTFacts(**facts))
