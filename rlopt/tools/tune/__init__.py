"""`rlopt tune RECIPE`: MetaSchedule-tune every network at each profile shape into `<recipe>.tuning/<target>/`.

The ONNX graph tuned is the one compile feeds TVM: the engine runs compile's own front end up to
padding (`FRONTEND_TO_PADDING`: script, export, checks, pad_gemm with the recipe's options), so a
record found here is found again by the build.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rlopt.errors import UsageError, located
from rlopt.recipe import Recipe, load_recipe


def network_onnx(recipe: Recipe, recipe_path: Path, model: Any, name: str, workdir: Path) -> Any:
    """The ONNX model compile feeds to TVM for this network (same stages, same options)."""
    from rlopt.compile.cache import StageCache
    from rlopt.compile.engine import Engine, Silent
    from rlopt.compile.gpu_path import plan_padding
    from rlopt.lazy import require
    from rlopt.stages.base import Context
    from rlopt.stages.frontend import FRONTEND_TO_PADDING
    from rlopt.user_model import submodule

    spec = recipe.networks[name]
    ctx = Context(recipe, recipe_path, name, spec, workdir, module=submodule(model, spec.module, recipe_path, name))
    ctx.dir.mkdir()
    plan_padding(ctx)
    Engine(Silent(), StageCache(enabled=False)).run_all([stage() for stage in FRONTEND_TO_PADDING], ctx)
    return require("onnx").load(str(ctx.artifacts[ctx.onnx_for("tvm")]))


def recipe_workloads(recipe: Recipe, recipe_path: Path, networks: list[str] | None, workdir: Path) -> list[Any]:
    from rlopt.backends.tvm.database import Workload, profile_shapes
    from rlopt.compile.sources import model_source

    unknown = [n for n in networks or [] if n not in recipe.networks]
    if unknown:
        raise UsageError(located(recipe_path, "networks", f"no network '{unknown[0]}'",
                                 f"use one of {', '.join(recipe.networks)}"))
    model, _ = model_source(recipe, recipe_path).load()
    workloads = []
    for name, spec in recipe.networks.items():
        if networks and name not in networks:
            continue
        onnx_model = network_onnx(recipe, recipe_path, model, name, workdir)
        workloads.extend(Workload(name, points, shapes, onnx_model) for points, shapes in profile_shapes(spec))
    return workloads


def tune_recipe(recipe_path: Path | str, *, trials: int = 64, time_budget_s: float | None = None,
                rpc: Any = None, networks: list[str] | None = None, reporter: Any = None) -> Any:
    """`rlopt tune`: tune every network of a recipe at each profile shape into `<recipe>.tuning/<target>/`."""
    from rlopt.backends.tvm.database import database_dir, resolve_target
    from rlopt.backends.tvm.tuning import check_budget, tune_workloads

    check_budget(trials, time_budget_s)
    recipe_path = Path(recipe_path)
    recipe = load_recipe(recipe_path)
    if recipe.tvm.target.get("kind") != "llvm":
        raise UsageError(located(recipe_path, "tvm.target", f"tuning here supports kind llvm, not "
                                 f"'{recipe.tvm.target.get('kind')}'", "tune CUDA targets on a GPU machine"))
    target = resolve_target(recipe.tvm.target)
    with tempfile.TemporaryDirectory(prefix="rlopt-tune-onnx-") as workdir:
        workloads = recipe_workloads(recipe, recipe_path, networks, Path(workdir))
        return tune_workloads(workloads, target, database_dir(recipe_path, target), trials=trials,
                              time_budget_s=time_budget_s, rpc=rpc, reporter=reporter)


__all__ = ["network_onnx", "recipe_workloads", "tune_recipe"]
