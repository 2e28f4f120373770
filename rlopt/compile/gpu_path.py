"""The GPU-path decisions the pipeline asks per network: padding multiple per backend, tolerance per precision,
the per-backend precision record, and the Triton repository. Pure functions over recipe and results.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlopt.manifest import BackendRecord, FileRecord, file_record
from rlopt.parity import Tolerance
from rlopt.recipe import NetworkSpec, Recipe, VerifyConfig
from rlopt.reference import Reference
from rlopt.backends.tvm.cuda import is_cuda_target
from rlopt.backends.tensorrt.plan import TensorRTPlan

AUTO_GPU_MULTIPLE = 256  # A10G Tensor Cores; padding costs 1.3-2.2x on CPU (shared notes), so CPU auto = off
REDUCED_PRECISIONS = ("fp16", "bf16", "int8", "tf32")  # tf32: fp32 layers with 10-bit mantissas


def padding_multiples(recipe: Recipe) -> dict[str, int]:
    """Backend -> pad_gemm multiple (0 = unpadded): an int applies to every ONNX consumer, auto only to GPU targets."""
    gpu = {"tensorrt": True, "tvm": is_cuda_target(recipe.tvm.target), "onnxruntime": False, "openvino": False}
    if recipe.pad_gemm == "auto":
        return {b: (AUTO_GPU_MULTIPLE if on_gpu else 0) for b, on_gpu in gpu.items()}
    return {b: int(recipe.pad_gemm) for b in gpu}


def wanted_multiple(recipe: Recipe) -> int:
    """The one multiple the padded model is written with: 0 when no backend that can build here wants padding.

    TensorRT that cannot build on this machine does not count, so `auto` pads nothing on a CPU-only
    machine unless TVM targets CUDA.
    """
    from rlopt.backends.tensorrt.build import tensorrt_unavailable_reason

    consumers = [b for b in recipe.backends if b != "tensorrt" or tensorrt_unavailable_reason() is None]
    chosen = {m for b, m in padding_multiples(recipe).items() if b in consumers and m > 0}
    return max(chosen) if chosen else 0


def tolerance_for(facts: dict[str, Any], verify: VerifyConfig) -> Tolerance:
    """Reduced-precision artifacts are gated by verify.reduced_precision, fp32 ones by the recipe's tolerances.

    A reduced gate is written into `facts["parity_gate"]`, so `rlopt verify` re-checks with the same one.
    """
    if facts.get("precision_built") in REDUCED_PRECISIONS:
        reduced = verify.reduced_precision
        facts["parity_gate"] = {"atol": reduced.atol, "rtol": reduced.rtol, "max_kl": reduced.max_kl,
                                "why": f"built in {facts['precision_built']} (verify.reduced_precision)"}
        return Tolerance(reduced.atol, reduced.rtol, reduced.max_kl)
    return Tolerance(verify.atol, verify.rtol, verify.max_kl)


def precision_record(spec: NetworkSpec, artifacts: dict[str, BackendRecord]) -> dict[str, Any]:
    """What each backend did with the network's precision on this machine, one line each."""
    lines: dict[str, str] = {}
    for backend, record in artifacts.items():
        if record.skipped:
            lines[backend] = f"not built: {record.skipped}"
            continue
        built = record.facts.get("precision_built", "fp32")
        line = f"built in {built}"
        if record.facts.get("notice"):
            line += f"; {record.facts['notice']}"
        if record.facts.get("not_verified"):
            line += f"; not verified here ({record.facts['not_verified']})"
        lines[backend] = line
    return {"requested": spec.precision, "backends": lines}


def write_triton(staging: Path, recipe_name: str, network: str, artifacts: dict[str, BackendRecord],
                 plan: TensorRTPlan, reference: Reference, spec: NetworkSpec) -> dict[str, FileRecord]:
    """Triton models for every verified backend Triton serves; returns the files to list in the manifest."""
    from rlopt.backends import facts_of
    from rlopt.compile.triton import PLATFORMS, output_shapes, write_models

    servable = {b: staging / r.path for b, r in artifacts.items() if b in PLATFORMS and r.verified and r.path}
    if not servable:
        return {}
    companions = {b: [staging / ref.path for ref in facts_of(b, artifacts[b].facts).companion_files()]
                  for b in servable}
    outputs = output_shapes(reference.arrays, reference.output_names)
    dtypes = {name: s.dtype for name, s in spec.inputs.items()}
    written = write_models(staging / "triton", recipe_name, network, servable, plan, outputs, dtypes, companions)
    return {p.relative_to(staging).as_posix(): file_record(staging, p) for p in written}
