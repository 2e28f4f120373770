"""The front end every backend and `rlopt tune` share: model source -> script -> reference -> ONNX -> checks -> padding.

`FRONTEND` is the list the engine runs per network; `FRONTEND_TO_PADDING` is the part `rlopt tune`
runs, so tuning sees exactly the ONNX graph the TVM build will import (padded or not).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from rlopt.errors import StageError, located
from rlopt.spec import RecipeSpec
from rlopt.stages.base import Context, Stage, StageOutput


# ---------------------------------------------------------------- where the model comes from

class ModelSource(Protocol):
    """Makes the model a recipe names (an nn.Module in eval mode) and says how (facts)."""

    def load(self) -> tuple[Any, dict[str, Any]]: ...


@dataclass
class FactorySource:
    """`model: {factory, kwargs, checkpoint, seed}`: a Python callable, optionally with a state_dict."""

    recipe: RecipeSpec
    recipe_path: Path

    def load(self) -> tuple[Any, dict[str, Any]]:
        from rlopt.user_model import build_model

        return build_model(self.recipe.model, self.recipe_path)


def recorded_source(ctx: Context) -> dict[str, Any]:
    """How `rlopt refit` rebuilds the eager model: the factory with its file made absolute, kwargs and seed."""
    spec = ctx.recipe.model
    if spec.factory is None:
        return {"sb3": True}
    target, _, attribute = spec.factory.rpartition(":")
    if target.endswith(".py") or "/" in target:
        target = str((ctx.recipe_path.parent / target).resolve())
    return {"factory": f"{target}:{attribute}", "kwargs": spec.kwargs, "seed": spec.seed}


# ---------------------------------------------------------------- identities

def interface(ctx: Context) -> dict[str, Any]:
    return ctx.spec.model_dump(mode="json", include={"inputs", "outputs", "kind", "distribution", "state"})


# ---------------------------------------------------------------- stages

class Script(Stage):
    name, outputs = "script", ("model.ts",)

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.stages.script import script_network

        out = script_network(ctx.module, ctx.dir / "model.ts", recipe_path=ctx.recipe_path, network=ctx.name,
                             module_path=ctx.spec.module)
        ctx.keys["module"] = {"graph": out.facts["graph_sha256"], "weights": out.facts["weights_sha256"]}
        ctx.facts["model_source"] = recorded_source(ctx)
        ctx.keys["model.ts"] = {**ctx.keys["module"], "code": self.code_version()}
        return out


class RecordReference(Stage):
    name, inputs, outputs, cached = "reference", ("module",), ("reference.npz",), True
    helpers = ("rlopt.reference", "rlopt.arrays")

    def config(self, ctx: Context) -> Any:
        verify = ctx.recipe.verify
        config = {"network": interface(ctx), "shapes": ctx.spec.shapes,
                  "verify": {"samples": verify.samples, "seed": verify.seed, "steps": verify.steps}}
        if ctx.artifacts.get("rollout_feeds"):   # SB3 agents: the visited observations join the reference
            config["rollout"] = verify.rollout.model_dump(mode="json") if verify.rollout else None
        return config

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.reference import record_reference

        path = ctx.dir / "reference.npz"
        reference = record_reference(ctx.module, ctx.spec, ctx.recipe.verify.samples, ctx.recipe.verify.seed,
                                     recipe_path=ctx.recipe_path, network=ctx.name, steps=ctx.recipe.verify.steps)
        if ctx.artifacts.get("rollout_feeds"):
            from rlopt.reference import add_rollout_point

            add_rollout_point(reference, ctx.module, ctx.artifacts["rollout_feeds"])
        reference.save(path)
        return StageOutput(path, {})

    def detail(self, ctx: Context, out: StageOutput) -> str:
        return f"{len(ctx.reference.points)} shapes x {ctx.recipe.verify.samples} samples"


class ExportOnnx(Stage):
    name, inputs, outputs, cached = "onnx", ("model.ts",), ("model.onnx",), True
    helpers = ("rlopt.stages.export_onnx", "rlopt.stages.control_flow", "rlopt.stages.shape_probe",
               "rlopt.stages.weight_map", "rlopt.onnx_graph", "rlopt.reference", "rlopt.arrays")

    def config(self, ctx: Context) -> Any:
        verify = ctx.recipe.verify
        return {"network": interface(ctx), "opset": ctx.recipe.onnx.opset,
                "probe": {"shapes": ctx.spec.shapes, "atol": verify.atol, "rtol": verify.rtol}}

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.stages.export_onnx import export_onnx

        verify = ctx.recipe.verify
        return export_onnx(ctx.artifacts["model.ts"], ctx.spec, ctx.recipe.onnx.opset, ctx.dir / "model.onnx",
                           recipe_path=ctx.recipe_path, network=ctx.name, eager_module=ctx.module,
                           tolerance=(verify.atol, verify.rtol))

    def detail(self, ctx: Context, out: StageOutput) -> str:
        return f"{out.facts.get('export_path', 'script')}, opset {out.facts['opset']}, {out.facts['if_nodes']} If"


class SpecializationGuard(Stage):
    """A check after export: every input's dims in the ONNX graph are what the recipe declares.

    A dim the recipe lets vary must stay symbolic (an exporter that specialized it would serve
    only the example shape); a fixed dim must have the recipe's value. Declared dims cannot show a length
    baked into a Reshape: the export itself ran the graph at each probe shape (rlopt.stages.shape_probe), and the
    count is reported here.
    """

    name, inputs = "specialization guard", ("model.onnx",)

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.lazy import require

        graph = require("onnx").load(str(ctx.artifacts["model.onnx"]), load_external_data=False).graph
        declared = {i.name: i for i in graph.input}
        checked = 0
        for name, spec in ctx.spec.inputs.items():
            if name not in declared:
                continue
            dims = declared[name].type.tensor_type.shape.dim
            wanted = spec.dims("min")
            problem = None
            if len(dims) != len(wanted):
                problem = f"input '{name}' has rank {len(dims)} in the exported graph, the recipe gives {len(wanted)}"
            for axis, dim in enumerate(dims if problem is None else []):
                symbolic = not dim.HasField("dim_value")
                if axis in spec.dynamic_axes and not symbolic:
                    problem = (f"input '{name}' dim {axis} varies in the recipe but the export fixed it to "
                               f"{dim.dim_value}")
                elif axis not in spec.dynamic_axes and not symbolic and dim.dim_value != wanted[axis]:
                    problem = f"input '{name}' dim {axis} is {dim.dim_value} in the export, {wanted[axis]} in the recipe"
                if problem:
                    break
            if problem:
                raise StageError(located(ctx.recipe_path, f"networks.{ctx.name}.inputs.{name}", problem,
                                         "make forward shape-generic along the recipe's dynamic dims"))
            checked += 1
        facts: dict[str, Any] = {"inputs_checked": checked}
        export = ctx.outputs.get("onnx")
        probe = export.facts.get("shape_probe") if export is not None else None
        if probe is not None:  # the export ran the graph at these shapes (rlopt.stages.shape_probe)
            facts["shapes_run"] = len(probe["checked"])
        return StageOutput(None, facts)

    def detail(self, ctx: Context, out: StageOutput) -> str:
        text = f"{out.facts['inputs_checked']} input(s) match the recipe"
        if "shapes_run" in out.facts:
            text += f"; the graph matches PyTorch at {out.facts['shapes_run']} more shape(s)"
        return text


class InputProfiles(Stage):
    """The inputs' shape profiles (min/opt/max, then the recipe's extra `profiles`), checked against the ONNX graph
    on every machine: the TensorRT build and the Triton configs use the same profile objects."""

    name, inputs, outputs = "profiles", ("model.onnx",), ("profiles",)

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.lazy import require
        from rlopt.stages.profiles import make_profiles

        graph = require("onnx").load(str(ctx.artifacts["model.onnx"]), load_external_data=False)
        profiles = make_profiles(ctx.spec, graph, recipe_path=ctx.recipe_path, network=ctx.name)
        ctx.artifacts["profiles"] = profiles
        ctx.facts["profiles"] = profiles.facts()
        return StageOutput(None, {})

    def detail(self, ctx: Context, out: StageOutput) -> str:
        profiles = ctx.artifacts["profiles"]
        return f"{len(profiles.profiles)} profile(s), batching {'up to ' + str(profiles.batching().max_batch_size) if profiles.batching().enabled else 'off'}"


class PadGemm(Stage):
    """model.padded.onnx for the backends whose pad_gemm multiple is on; dropped when it is not exact."""

    name, inputs, outputs = "pad_gemm", ("model.onnx",), ("model.padded.onnx",)

    def multiple(self, ctx: Context) -> int:
        return ctx.pad_multiple

    def config(self, ctx: Context) -> Any:
        return {"multiple": self.multiple(ctx), "pad_outputs": ctx.recipe.pad_gemm_outputs}

    def applies(self, ctx: Context) -> bool:
        ctx.artifacts.setdefault("model.padded.onnx", None)
        if self.multiple(ctx) > 0:
            return True
        ctx.facts["pad_gemm"] = {"applied": False, "pad_gemm": ctx.recipe.pad_gemm,
                                 "reason": "off" if ctx.recipe.pad_gemm == 0 else
                                 "auto pads only for backends that want it on their target (a GPU), and none of "
                                 "those can build here"}
        return False

    def feeds(self, ctx: Context) -> list[dict[str, Any]]:
        reference = ctx.reference
        return [reference.feeds(p, i) for p in reference.points for i in range(reference.samples(p))]

    def run(self, ctx: Context) -> StageOutput:
        from rlopt.stages.pad_gemm import pad_gemm

        padded = pad_gemm(ctx.artifacts["model.onnx"], self.multiple(ctx), ctx.dir / "model.padded.onnx",
                          self.feeds(ctx), recipe_path=ctx.recipe_path, network=ctx.name,
                          pad_outputs=ctx.recipe.pad_gemm_outputs)
        ctx.facts["pad_gemm"] = padded.facts
        if padded.artifact is None:
            return padded
        diff = padded.facts["exactness"]["max_abs_diff"]
        atol = ctx.recipe.verify.atol
        if diff > atol:
            padded.facts["dropped"] = f"max diff {diff:.3g} vs the unpadded model > atol {atol}"
            padded.artifact.unlink()
            ctx.failures.append(f"{ctx.name}/pad_gemm: padded model differs from the unpadded one by {diff:.3g}")
            return StageOutput(None, padded.facts)
        return padded

    def detail(self, ctx: Context, out: StageOutput) -> str:
        facts = out.facts
        text = f"{len(facts['padded'])} edge(s) padded, {len(facts['skipped'])} skipped"
        return text + (f", max diff {facts['exactness']['max_abs_diff']:.1e}" if "exactness" in facts else "")


def example_feeds(ctx: Context) -> list[dict[str, Any]]:
    """Seeded random inputs at min/opt/max: padding's exactness feeds where no reference is recorded."""
    import numpy as np

    from rlopt.reference import random_input

    rng = np.random.default_rng(0)
    return [{n: random_input(rng, s, s.dims(p)) for n, s in ctx.spec.inputs.items()} for p in ("min", "opt", "max")]


class PadGemmForTuning(PadGemm):
    """The same padding on seeded example feeds instead of the reference (what `rlopt tune` runs)."""

    def feeds(self, ctx: Context) -> list[dict[str, Any]]:
        return example_feeds(ctx)


FRONTEND: list[type[Stage]] = [Script, RecordReference, ExportOnnx, SpecializationGuard, InputProfiles, PadGemm]
FRONTEND_TO_PADDING: list[type[Stage]] = [Script, ExportOnnx, SpecializationGuard, PadGemmForTuning]


__all__ = [
    "FRONTEND",
    "FRONTEND_TO_PADDING",
    "ExportOnnx",
    "FactorySource",
    "InputProfiles",
    "ModelSource",
    "PadGemm",
    "PadGemmForTuning",
    "RecordReference",
    "Script",
    "SpecializationGuard",
    "example_feeds",
    "recorded_source",
]
