"""OpenVINO's compile stage: the IR converted from the ONNX file ONNX Runtime would open, proven to compile here."""

from __future__ import annotations

from typing import Any

from rlopt.compile.stage import Context, Stage, StageOutput

REDUCED = ("fp16", "bf16")  # built only where the CPU has them: the build depends on this machine then


class OpenVinoConvert(Stage):
    """`model.xml` + `model.bin`; cached by graph, weights, shapes, precision and the OpenVINO version."""

    name, inputs, outputs = "openvino", ("model.onnx", "model.padded.onnx"), ("openvino",)
    cached = True
    helpers = ("rlopt.backends.openvino.convert", "rlopt.backends.openvino.facts", "rlopt.backends.openvino.library")

    def upstream(self, ctx: Context) -> dict[str, Any]:
        source = ctx.onnx_for("openvino")
        return {source: ctx.keys.get(source)}

    def cacheable(self, ctx: Context) -> bool:
        from rlopt.backends.openvino.library import openvino_missing

        return openvino_missing() is None  # else `run` says why it is skipped; a cached IR could not be verified

    def config(self, ctx: Context) -> Any:
        from rlopt.backends.openvino.convert import input_bounds
        from rlopt.lazy import version_of
        from rlopt.machine import cpu_identity

        return {"precision": ctx.spec.precision, "input_bounds": input_bounds(ctx.spec),
                "openvino": version_of("openvino"),
                "cpu": cpu_identity() if ctx.spec.precision in REDUCED else None}

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.backends.openvino.convert import build_openvino

        return build_openvino(ctx.artifacts[ctx.onnx_for("openvino")], ctx.dir, ctx.spec, recipe_path=ctx.recipe_path,
                              network=ctx.name)
