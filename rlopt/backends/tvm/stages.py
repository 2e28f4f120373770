"""TVM's compile stages: the CUDA library for a CUDA target, else the llvm libraries (dynamic + static per shape)."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

from rlopt.backends.tvm.facts import TUNE_HINT, TvmFacts
from rlopt.backends.tvm.schedules import MODULES as SCHEDULE_MODULES
from rlopt.stages.base import Context, Stage, StageOutput


def tuning_digest(recipe_path: Path) -> str | None:
    """sha256 over the recipe's tuning database (`<recipe>.tuning/`), so a new record invalidates TVM builds."""
    from rlopt.files import sha256_file

    folder = recipe_path.parent / f"{recipe_path.stem}.tuning"
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}:{sha256_file(path)}".encode())
    return digest.hexdigest()


def _is_cuda(ctx: Context) -> bool:
    return bool(ctx.recipe.tvm.on_cuda)


class _TvmStage(Stage):
    name, inputs, outputs, facts_model = "tvm", ("model.onnx", "model.padded.onnx"), ("tvm",), TvmFacts

    def upstream(self, ctx: Context) -> dict[str, Any]:
        source = ctx.onnx_for("tvm")
        return {source: ctx.keys.get(source)}

    def detail(self, ctx: Context, out: StageOutput) -> str:
        name = out.artifact.name if out.artifact else ""
        summary = (out.facts.tuning_summary or "").replace(TUNE_HINT, f"rlopt tune {ctx.recipe_path}")
        return name + (f" ({summary})" if summary else "")


class TvmCudaBuild(_TvmStage):
    """A CUDA library (built without a GPU; verified where one is)."""

    helpers = ("rlopt.backends.tvm.cuda", "rlopt.backends.tvm.build", "rlopt.onnx_graph")

    def applies(self, ctx: Context) -> bool:
        return _is_cuda(ctx)

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.backends.tvm.cuda import build_tvm_cuda

        return build_tvm_cuda(ctx.artifacts[ctx.onnx_for("tvm")], ctx.recipe.tvm, ctx.dir,
                              precision=ctx.spec.precision, recipe_path=ctx.recipe_path, network=ctx.name)


class TvmBuild(_TvmStage):
    """The dynamic library (the artifact), one tuned static library per named shape, and the params file they take."""

    cached, machine_dependent = True, True
    helpers = ("rlopt.backends.tvm.build", "rlopt.backends.tvm.importer", "rlopt.backends.tvm.database",
               "rlopt.backends.tvm.cpu_features", "rlopt.backends.tvm.params", "rlopt.backends.tvm.normalize",
               "rlopt.backends.tvm.recurrent", "rlopt.backends.tvm.facts", "rlopt.backends.tvm.padding", "rlopt.arrays",
               "rlopt.backends.tvm.fast_sigmoid", *SCHEDULE_MODULES)

    def applies(self, ctx: Context) -> bool:
        return not _is_cuda(ctx)

    def cacheable(self, ctx: Context) -> bool:
        return ctx.recipe.tvm.tune_trials == 0

    def config(self, ctx: Context) -> Any:
        return {"precision": ctx.spec.precision,
                "network": ctx.spec.model_dump(mode="json", include={"inputs", "profiles", "shapes"}),
                "recipe": ctx.recipe.tvm.model_dump(mode="json"), "tuning_database": tuning_digest(ctx.recipe_path)}

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.backends.tvm.build import build_tvm

        return build_tvm(ctx.artifacts[ctx.onnx_for("tvm")], ctx.recipe.tvm, ctx.dir, recipe_path=ctx.recipe_path,
                         network=ctx.name, spec=ctx.spec)
