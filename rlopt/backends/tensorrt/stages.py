"""TensorRT's compile stage: model.plan from the (padded) ONNX and the validated plan; gated first."""

from __future__ import annotations

from typing import Any

from rlopt.compile.stage import Context, Stage, StageOutput


class TensorRTEngine(Stage):
    name, inputs, outputs = "tensorrt", ("model.onnx", "model.padded.onnx", "tensorrt_plan"), ("tensorrt",)
    cached, machine_dependent = True, True
    helpers = ("rlopt.backends.tensorrt.build", "rlopt.backends.tensorrt.prepare", "rlopt.backends.tensorrt.adapter",
               "rlopt.backends.tensorrt.gate", "rlopt.onnx_graph")

    def config(self, ctx: Context) -> Any:
        return {"precision": ctx.spec.precision,
                "network": ctx.spec.model_dump(mode="json", include={"inputs", "profiles", "shapes"}),
                "recipe": ctx.recipe.tensorrt.model_dump(mode="json")}

    def upstream(self, ctx: Context) -> dict[str, Any]:
        source = ctx.onnx_for("tensorrt")
        return {source: ctx.keys.get(source)}

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.backends.tensorrt.build import build_engine

        return build_engine(ctx.artifacts[ctx.onnx_for("tensorrt")], ctx.artifacts["tensorrt_plan"], ctx.dir,
                            recipe_path=ctx.recipe_path, network=ctx.name)
