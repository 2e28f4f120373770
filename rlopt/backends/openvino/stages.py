"""OpenVINO's compile stage: the IR converted from the ONNX file ONNX Runtime would open, proven to compile here."""

from __future__ import annotations

from typing import Any

from rlopt.backends.openvino.facts import OpenVinoFacts
from rlopt.stages.base import Context, Stage, StageOutput


class OpenVinoConvert(Stage):
    """`model.xml` + `model.bin`; cached by graph, weights and `convert.cache_key` (bounds, precision, OpenVINO)."""

    name, inputs, outputs = "openvino", ("model.onnx", "model.padded.onnx"), ("openvino",)
    cached, facts_model = True, OpenVinoFacts
    helpers = ("rlopt.backends.openvino.convert", "rlopt.backends.openvino.facts", "rlopt.backends.openvino.library")

    def upstream(self, ctx: Context) -> dict[str, Any]:
        source = ctx.onnx_for("openvino")
        return {source: ctx.keys.get(source)}

    def cacheable(self, ctx: Context) -> bool:
        from rlopt.backends.openvino.library import openvino_missing

        return openvino_missing() is None  # else `run` says why it is skipped; a cached IR could not be verified

    def config(self, ctx: Context) -> Any:
        from rlopt.backends.openvino.convert import cache_key

        return cache_key(ctx.spec)

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.backends.openvino.convert import build_openvino

        return build_openvino(ctx.artifacts[ctx.onnx_for("openvino")], ctx.dir, ctx.spec, recipe_path=ctx.recipe_path,
                              network=ctx.name)
