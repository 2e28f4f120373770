"""ONNX Runtime's compile stage: the ONNX file, proven to open with the requested providers; int8 where asked."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlopt.backends.onnxruntime.facts import OnnxRuntimeFacts
from rlopt.stages.base import Context, Stage, StageOutput


class OnnxRuntimeCheck(Stage):
    name, inputs, outputs = "onnxruntime", ("model.onnx", "model.padded.onnx"), ("onnxruntime",)
    facts_model = OnnxRuntimeFacts
    helpers = ("rlopt.backends.onnxruntime.build", "rlopt.backends.onnxruntime.quantize")

    def upstream(self, ctx: Context) -> dict[str, Any]:
        source = ctx.onnx_for("onnxruntime")
        return {source: ctx.keys.get(source)}

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.backends.onnxruntime.build import check_onnxruntime

        source: Path = ctx.artifacts[ctx.onnx_for("onnxruntime")]
        if ctx.spec.precision != "int8":
            return check_onnxruntime(source, ctx.recipe.onnxruntime)
        from rlopt.backends.onnxruntime.quantize import quantize_int8

        quantized = quantize_int8(source, ctx.dir / "model.int8.onnx", ctx.reference, kind=ctx.spec.kind,
                                  distribution=ctx.spec.distribution,
                                  gate=ctx.recipe.verify.gate_for("int8")[0],
                                  recipe_path=ctx.recipe_path, network=ctx.name)
        assert quantized.artifact is not None
        checked = check_onnxruntime(quantized.artifact, ctx.recipe.onnxruntime)
        return StageOutput(quantized.artifact, checked.facts.updated(**quantized.facts))
