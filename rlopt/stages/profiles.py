"""The inputs' shape profiles: min/opt/max per input (profile 0), then the recipe's extra `profiles`, checked
against the ONNX graph's inputs (names, dtypes, ranks, every static dim) before any backend builds.

Made on every machine by the front end, so a bad profile is one located recipe error here, not a failure minutes
into a build. A backend that builds optimization profiles (TensorRT) and the Triton configs (`rlopt.compile.triton`)
use these same objects: a config whose dims or batch size disagree with an engine cannot be written.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlopt.errors import RecipeError, StageError, located
from rlopt.spec import NetworkSpec


@dataclass(frozen=True)
class ShapeRange:
    """min/opt/max of one input in one profile."""

    min: tuple[int, ...]
    opt: tuple[int, ...]
    max: tuple[int, ...]

    def point(self, name: str) -> tuple[int, ...]:
        return {"min": self.min, "opt": self.opt, "max": self.max}[name]

    def dynamic(self, axis: int) -> bool:
        return self.min[axis] != self.max[axis]


@dataclass(frozen=True)
class OptimizationProfile:
    """One TensorRT optimization profile: a ShapeRange per network input, in input order."""

    shapes: tuple[tuple[str, ShapeRange], ...]

    def __getitem__(self, name: str) -> ShapeRange:
        return dict(self.shapes)[name]

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.shapes]


@dataclass(frozen=True)
class OnnxInput:
    name: str
    dtype: str
    dims: tuple[int | str, ...]  # int for a static dim, the dim_param (or "?") for a dynamic one


@dataclass(frozen=True)
class Batching:
    """How Triton may batch: dim 0 of every input is one shared dynamic batch dim starting at 1, or no batching."""

    max_batch_size: int
    preferred: tuple[int, ...]

    @property
    def enabled(self) -> bool:
        return self.max_batch_size > 0


@dataclass(frozen=True)
class ShapeProfiles:
    """A network's inputs as the ONNX graph declares them and its validated profiles (profile 0 first)."""

    network: str
    inputs: tuple[OnnxInput, ...]
    profiles: tuple[OptimizationProfile, ...]

    @property
    def envelope(self) -> OptimizationProfile:
        """Profile 0: the inputs' own min/opt/max, which every other profile lies inside."""
        return self.profiles[0]

    def batching(self) -> Batching:
        """Batching Triton can do without ever sending a shape outside profile 0."""
        envelope = self.envelope
        ranges = [envelope[name] for name in envelope.names]
        shared = {(r.min[0], r.max[0]) for r in ranges}
        first_dims = {i.dims[0] for i in self.inputs if i.dims}
        if (len(shared) != 1 or any(len(r.min) < 2 or not r.dynamic(0) for r in ranges)
                or any(isinstance(d, int) for d in first_dims) or len(first_dims) != 1):
            return Batching(0, ())
        low, high = shared.pop()
        if low != 1:
            return Batching(0, ())
        preferred = sorted({r.opt[0] for r in ranges} | {high})
        return Batching(high, tuple(preferred))

    def facts(self) -> list[dict[str, dict[str, list[int]]]]:
        """Every profile as JSON: input -> {min, opt, max}."""
        return [{name: {"min": list(r.min), "opt": list(r.opt), "max": list(r.max)} for name, r in p.shapes}
                for p in self.profiles]


def onnx_inputs(model: Any) -> tuple[OnnxInput, ...]:
    """Graph inputs that are not initializers, with their dtype and dims."""
    from onnx import helper

    initializers = {init.name for init in model.graph.initializer}
    found = []
    for value in model.graph.input:
        if value.name in initializers:
            continue
        tensor = value.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tensor.elem_type).name if tensor.elem_type else "?"
        dims = tuple(d.dim_value if d.HasField("dim_value") else (d.dim_param or "?") for d in tensor.shape.dim)
        found.append(OnnxInput(value.name, dtype, dims))
    return tuple(found)


def _range(dims: dict[str, list[int]]) -> ShapeRange:
    return ShapeRange(tuple(dims["min"]), tuple(dims["opt"]), tuple(dims["max"]))


def _check_profile(profile: OptimizationProfile, index: int, inputs: tuple[OnnxInput, ...],
                   envelope: OptimizationProfile | None, recipe_path: Path, network: str) -> None:
    where = f"networks.{network}.profiles[{index - 1}]" if index else f"networks.{network}.inputs"
    names = [i.name for i in inputs]
    if sorted(profile.names) != sorted(names):
        raise RecipeError(located(recipe_path, where, f"profile {index} gives inputs {profile.names}, the ONNX graph "
                                  f"takes {names}", "give min/opt/max for exactly the graph's inputs"))
    symbols: dict[str, tuple[int, int, int, str]] = {}
    for onnx_input in inputs:
        shape = profile[onnx_input.name]
        field = f"{where}.{onnx_input.name}"
        if len(shape.min) != len(onnx_input.dims) or not len(shape.min) == len(shape.opt) == len(shape.max):
            raise RecipeError(located(recipe_path, field, f"rank {len(shape.min)} but the ONNX input has rank "
                                      f"{len(onnx_input.dims)} {list(onnx_input.dims)}", "give one value per dim"))
        for axis, dim in enumerate(onnx_input.dims):
            lo, mid, hi = shape.min[axis], shape.opt[axis], shape.max[axis]
            if not 1 <= lo <= mid <= hi:
                raise RecipeError(located(recipe_path, field, f"dim {axis} needs 1 <= min <= opt <= max, got "
                                          f"{lo}, {mid}, {hi}", "order the values"))
            if isinstance(dim, int) and dim > 0 and (lo, mid, hi) != (dim, dim, dim):
                raise RecipeError(located(recipe_path, field, f"dim {axis} is static {dim} in the ONNX graph, the "
                                          f"profile gives {lo}..{hi}", f"set min/opt/max of dim {axis} to {dim}"))
            if isinstance(dim, str) and dim != "?":
                seen = symbols.setdefault(dim, (lo, mid, hi, onnx_input.name))
                if seen[:3] != (lo, mid, hi):
                    raise RecipeError(located(recipe_path, field, f"dim {axis} ('{dim}') is {lo}/{mid}/{hi} but the "
                                              f"same dim of '{seen[3]}' is {seen[0]}/{seen[1]}/{seen[2]}",
                                              "give shared dims the same min/opt/max"))
            if envelope is not None:
                outer = envelope[onnx_input.name]
                if not (outer.min[axis] <= lo and hi <= outer.max[axis]):
                    raise RecipeError(located(recipe_path, field, f"dim {axis} range {lo}..{hi} leaves the inputs' "
                                              f"range {outer.min[axis]}..{outer.max[axis]}",
                                              "keep extra profiles inside the inputs' min/max"))


def make_profiles(spec: NetworkSpec, model: Any, *, recipe_path: Path, network: str) -> ShapeProfiles:
    """The validated profiles of one network; every mismatch with the ONNX graph is a located RecipeError."""
    inputs = onnx_inputs(model)
    if [i.name for i in inputs] != list(spec.inputs):
        raise RecipeError(located(recipe_path, f"networks.{network}.inputs", f"the ONNX graph takes "
                                  f"{[i.name for i in inputs]}, the recipe names {list(spec.inputs)}",
                                  "name the inputs in the module's argument order"))
    for onnx_input in inputs:
        wanted = spec.inputs[onnx_input.name].dtype
        if onnx_input.dtype != wanted:
            raise StageError(located(recipe_path, f"networks.{network}.inputs.{onnx_input.name}.dtype",
                                     f"the ONNX graph takes {onnx_input.dtype}, the recipe says {wanted}",
                                     f"set dtype: {onnx_input.dtype}"))
    envelope = OptimizationProfile(tuple((name, _range({p: s.dims(p) for p in ("min", "opt", "max")}))
                                         for name, s in spec.inputs.items()))
    profiles = [envelope]
    for extra in spec.profiles:
        profiles.append(OptimizationProfile(tuple((name, _range(r.model_dump())) for name, r in extra.items())))
    for index, profile in enumerate(profiles):
        _check_profile(profile, index, inputs, envelope if index else None, recipe_path, network)
    return ShapeProfiles(network=network, inputs=inputs, profiles=tuple(profiles))


__all__ = ["Batching", "OnnxInput", "OptimizationProfile", "ShapeProfiles", "ShapeRange", "make_profiles", "onnx_inputs"]
