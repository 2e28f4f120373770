"""TensorRT's compile stage: model.plan from the (padded) ONNX, the front end's profiles and the recipe's settings;
gated first."""

from __future__ import annotations

from typing import Any

from rlopt.backends.tensorrt.facts import TensorRTFacts
from rlopt.errors import BackendUnavailable
from rlopt.stages.base import Context, Stage, StageOutput


class TensorRTEngine(Stage):
    name, inputs, outputs = "tensorrt", ("model.onnx", "model.padded.onnx", "profiles"), ("tensorrt",)
    facts_model = TensorRTFacts
    cached, machine_dependent = True, True
    helpers = ("rlopt.backends.tensorrt.build", "rlopt.backends.tensorrt.prepare", "rlopt.backends.tensorrt.adapter",
               "rlopt.backends.tensorrt.plan", "rlopt.backends.tensorrt.gate", "rlopt.backends.tensorrt.facts",
               "rlopt.onnx_graph")

    def config(self, ctx: Context) -> Any:
        return {"precision": ctx.spec.precision,
                "network": ctx.spec.model_dump(mode="json", include={"inputs", "profiles", "shapes"}),
                "recipe": ctx.recipe.tensorrt.model_dump(mode="json")}

    def upstream(self, ctx: Context) -> dict[str, Any]:
        source = ctx.onnx_for("tensorrt")
        return {source: ctx.keys.get(source)}

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.backends.tensorrt.build import build_engine
        from rlopt.backends.tensorrt.plan import plan_for

        plan = plan_for(ctx.artifacts["profiles"], ctx.spec, ctx.recipe.tensorrt, recipe_path=ctx.recipe_path)
        try:
            return build_engine(ctx.artifacts[ctx.onnx_for("tensorrt")], plan, ctx.dir, recipe_path=ctx.recipe_path,
                                network=ctx.name)
        except BackendUnavailable as exc:  # skipped: the plan this machine would have built is still recorded
            raise BackendUnavailable(str(exc), {**plan.facts(), **exc.facts}) from None
