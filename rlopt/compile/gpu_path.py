"""The per-network decisions compile takes from the backends' declarations: the GEMM padding multiple per
backend, the per-backend precision record, and the Triton repository. Pure functions over recipe and results.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlopt.backends import BACKENDS
from rlopt.facts import PrecisionFacts
from rlopt.manifest import BackendRecord, FileRecord, file_record
from rlopt.reference import Reference
from rlopt.spec import NetworkSpec, RecipeSpec
from rlopt.stages.base import Context
from rlopt.stages.profiles import ShapeProfiles

AUTO_GPU_MULTIPLE = 256  # A10G Tensor Cores; padding costs 1.3-2.2x on CPU (shared notes), so CPU auto = off


def _config(recipe: RecipeSpec, backend: str) -> Any:
    return recipe.section(backend) if BACKENDS[backend].config is not None else None


def padding_multiples(recipe: RecipeSpec) -> dict[str, int]:
    """Backend -> pad_gemm multiple (0 = unpadded) for every registered backend that reads the ONNX graph: an int
    applies to each, `auto` only to those whose `pads_gemm` says their target wants it."""
    readers = {name: backend for name, backend in BACKENDS.items() if backend.pads_gemm is not None}
    if recipe.pad_gemm == "auto":
        return {name: AUTO_GPU_MULTIPLE if backend.pads_gemm(_config(recipe, name)) else 0  # type: ignore[misc]
                for name, backend in readers.items()}
    return {name: int(recipe.pad_gemm) for name in readers}


def wanted_multiple(recipe: RecipeSpec) -> int:
    """The one multiple the padded model is written with: 0 when no backend of the recipe that can build here wants
    padding (`Backend.build_unavailable`: TensorRT without a GPU does not count, so `auto` pads nothing on a
    CPU-only machine unless TVM targets CUDA)."""
    multiples = padding_multiples(recipe)
    chosen = {multiples[b] for b in recipe.backends
              if multiples.get(b, 0) > 0 and BACKENDS[b].build_unavailable(_config(recipe, b)) is None}
    return max(chosen) if chosen else 0


def plan_padding(ctx: Context) -> None:
    """Set the context's padding decision before its front end runs (the PadGemm stage reads it)."""
    ctx.pad_multiple = wanted_multiple(ctx.recipe)
    ctx.padded_for = frozenset(b for b, m in padding_multiples(ctx.recipe).items() if m > 0)


def precision_record(spec: NetworkSpec, artifacts: dict[str, BackendRecord]) -> PrecisionFacts:
    """What each backend did with the network's precision on this machine, one line each."""
    lines: dict[str, str] = {}
    for backend, record in artifacts.items():
        if record.skipped:
            lines[backend] = f"not built: {record.skipped}"
            continue
        facts = record.facts
        line = f"built in {facts.precision_built or 'fp32'}"
        if facts.notice:
            line += f"; {facts.notice}"
        if facts.not_verified:
            line += f"; not verified here ({facts.not_verified})"
        lines[backend] = line
    return PrecisionFacts(requested=spec.precision, backends=lines)


def write_triton(staging: Path, recipe_name: str, network: str, artifacts: dict[str, BackendRecord],
                 plan: ShapeProfiles, reference: Reference, spec: NetworkSpec) -> dict[str, FileRecord]:
    """Triton models for every verified backend Triton serves (each with its artifact's companion files); returns the
    files to list in the manifest."""
    from rlopt.backends import facts_of
    from rlopt.compile.triton import SERVED, output_shapes, write_models

    servable = {b: staging / r.path for b, r in artifacts.items() if b in SERVED and r.verified and r.path}
    if not servable:
        return {}
    companions = {b: [staging / ref.path for ref in facts_of(b, artifacts[b].facts).companion_files()]
                  for b in servable}
    outputs = output_shapes(reference.arrays, reference.output_names)
    dtypes = {name: s.dtype for name, s in spec.inputs.items()}
    written = write_models(staging / "triton", recipe_name, network, servable, plan, outputs, dtypes, companions)
    return {p.relative_to(staging).as_posix(): file_record(staging, p) for p in written}
