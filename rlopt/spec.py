"""The recipe's sections every backend shares (contract section 1): model, networks, inputs, ONNX, verification.

A backend's own section is its `Backend.config` model; `rlopt.recipe.Recipe` is `RecipeSpec` plus one section per
registered backend. The stages and the backends read these models; none of them needs the whole recipe type.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationInfo, field_validator, model_validator

from rlopt.arrays import shape_label
from rlopt.ci_config import CiConfig
from rlopt.facts import ParityGate
from rlopt.parity import Tolerance

DTYPES: tuple[str, ...] = ("float32", "float16", "float64", "int64", "int32", "uint8", "bool")
INTEGER_DTYPES: tuple[str, ...] = ("int64", "int32", "uint8")
NAME_PATTERN = r"^[a-z0-9_-]+$"

DType = Literal["float32", "float16", "float64", "int64", "int32", "uint8", "bool"]
Precision = Literal["fp32", "fp16", "bf16", "int8"]
Kind = Literal["policy", "value", "generic"]
PROFILE_POINTS: tuple[str, ...] = ("min", "opt", "max")



def _require_some(value: Any, message: str) -> None:
    """The validators' shared refusal of an empty list or mapping."""
    if not value:
        raise ValueError(message)

class Strict(BaseModel):
    """A recipe section: unknown keys are refused (a misspelled option is an error, not ignored)."""

    model_config = ConfigDict(extra="forbid", frozen=False)


class InputSpec(Strict):
    """One network input: a dtype and either a static `shape` or a min/opt/max profile."""

    dtype: DType = "float32"
    shape: list[int] | None = None
    min: list[int] | None = None
    opt: list[int] | None = None
    max: list[int] | None = None
    # integer inputs: the values verification samples, inclusive (default: the embedding's size, else 0-9)
    range: list[int] | None = None

    @field_validator("range")
    @classmethod
    def _range(cls, value: list[int] | None, info: ValidationInfo) -> list[int] | None:
        if value is None:
            return value
        dtype = info.data.get("dtype", "float32")
        if dtype not in INTEGER_DTYPES:
            raise ValueError(f"'range' applies to integer inputs, this one is {dtype}; fix: drop 'range' or use "
                             f"one of {', '.join(INTEGER_DTYPES)}")
        if len(value) != 2 or value[0] > value[1]:
            raise ValueError(f"{value} is not [lo, hi] with lo <= hi; fix: give two integers, e.g. [0, 499]")
        limits = {"uint8": (0, 255), "int32": (-2**31, 2**31 - 1), "int64": (-2**63, 2**63 - 1)}[dtype]
        if value[0] < limits[0] or value[1] > limits[1]:
            raise ValueError(f"{value} does not fit {dtype}; fix: keep it inside [{limits[0]}, {limits[1]}]")
        return value

    @model_validator(mode="after")
    def _profile(self) -> InputSpec:
        given = [p for p in PROFILE_POINTS if getattr(self, p) is not None]
        if self.shape is not None:
            if given:
                raise ValueError("give either 'shape' (static) or 'min'/'opt'/'max' (dynamic), not both")
            self.min, self.opt, self.max = list(self.shape), list(self.shape), list(self.shape)
        elif len(given) != 3:
            missing = [p for p in PROFILE_POINTS if p not in given]
            raise ValueError(f"missing {', '.join(missing)}: give all of min, opt and max, or 'shape'")
        assert self.min is not None and self.opt is not None and self.max is not None
        if not (len(self.min) == len(self.opt) == len(self.max)):
            raise ValueError(
                f"rank mismatch: min has {len(self.min)} dims, opt {len(self.opt)}, max {len(self.max)}"
            )
        for axis, (lo, mid, hi) in enumerate(zip(self.min, self.opt, self.max)):
            if lo < 1:
                raise ValueError(f"dim {axis} is {lo}; every dim must be >= 1")
            if not lo <= mid <= hi:
                raise ValueError(f"dim {axis} needs min <= opt <= max, got {lo} <= {mid} <= {hi}")
        self.shape = None
        return self

    def dims(self, point: str) -> list[int]:
        value = getattr(self, point)
        assert value is not None
        return list(value)

    @property
    def dynamic_axes(self) -> list[int]:
        assert self.min is not None and self.max is not None
        return [i for i, (lo, hi) in enumerate(zip(self.min, self.max)) if lo != hi]


def shape_slug(shapes: dict[str, list[int]]) -> str:
    """`2x8x768` (inputs joined by '-'): the name of an extra shape in reference.npz, the manifest and file names."""
    return shape_label(shapes.values())


def shape_problem(shapes: dict[str, list[int]], inputs: dict[str, InputSpec]) -> str | None:
    """Why `shapes` cannot be fed to a network with these inputs, or None."""
    if set(shapes) != set(inputs):
        return f"names inputs {sorted(shapes)}; give exactly the network's inputs {sorted(inputs)}"
    for name, dims in shapes.items():
        spec = inputs[name]
        assert spec.min is not None and spec.max is not None
        if len(dims) != len(spec.min) or not all(lo <= d <= hi for d, lo, hi in zip(dims, spec.min, spec.max)):
            return f"{name} {list(dims)} is outside the profile [min {spec.min}, max {spec.max}]"
    return None


class ProfileRange(Strict):
    """One input's min/opt/max inside an extra TensorRT optimization profile."""

    min: list[int]
    opt: list[int]
    max: list[int]


class NetworkSpec(Strict):
    """One network compiled on its own: a submodule of the model, its inputs and outputs."""

    module: str = ""
    kind: Kind = "generic"
    distribution: Literal["categorical", "gaussian"] = "categorical"
    inputs: dict[str, InputSpec]
    outputs: list[str]
    precision: Precision = "fp32"
    # Extra TensorRT optimization profiles (input -> min/opt/max), each inside the inputs' [min, max];
    # profile 0 is always the inputs' own min/opt/max. Checked in rlopt.backends.tensorrt.plan.
    profiles: list[dict[str, ProfileRange]] = Field(default_factory=list)
    # Extra exact shapes (input -> dims) besides min/opt/max, each inside [min, max]: recorded in the
    # reference, verified, timed and given their own tuned TVM library; `auto` routes each to its fastest
    # backend. A recipe's `warmup_profile` adds the shapes its requests name.
    shapes: list[dict[str, list[int]]] = Field(default_factory=list)
    # Recurrent state (contract section 8): input -> the output it is fed from on the next step.
    state: dict[str, str] = Field(default_factory=dict)

    @field_validator("state")
    @classmethod
    def _state(cls, value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        inputs, outputs = info.data.get("inputs"), info.data.get("outputs")
        if not inputs or not outputs:
            return value  # their own error is reported
        for state_input, state_output in value.items():
            if state_input not in inputs:
                raise ValueError(f"'{state_input}' is not an input of this network; fix: name one of "
                                 f"{sorted(inputs)} as the key (input: output)")
            if state_output not in outputs:
                raise ValueError(f"'{state_output}' (fed back into {state_input}) is not one of the outputs "
                                 f"{outputs}; fix: name an output as the value (input: output)")
        if len(set(value.values())) != len(value):
            raise ValueError(f"{value} feeds one output into two inputs; fix: pair each state input with its own output")
        if len(value) == len(inputs):
            raise ValueError("every input is state; fix: keep at least one input (the observation) outside 'state'")
        batches = {name: (spec.dims("min")[0], spec.dims("max")[0]) for name, spec in inputs.items()}
        for state_input in value:
            spec = inputs[state_input]
            if spec.dtype not in ("float32", "float16", "float64"):
                raise ValueError(f"state input '{state_input}' is {spec.dtype}; fix: give recurrent state a float dtype")
            others = {b for name, b in batches.items() if name not in value}
            if len(others) == 1 and batches[state_input] not in others:
                (lo, hi), = others
                raise ValueError(f"state input '{state_input}' has batch dim {batches[state_input][0]}.."
                                 f"{batches[state_input][1]}, the other inputs {lo}..{hi}; fix: give the state the "
                                 f"same batch range (dim 0) as the observation")
        return value

    @field_validator("shapes")
    @classmethod
    def _extra_shapes(cls, value: list[dict[str, list[int]]], info: ValidationInfo) -> list[dict[str, list[int]]]:
        inputs = info.data.get("inputs")
        if not inputs:
            return value  # the inputs' own error is reported
        ordered = []
        for index, shapes in enumerate(value):
            problem = shape_problem(shapes, inputs)
            if problem:
                raise ValueError(f"[{index}]: {problem}; fix: keep every extra shape inside the inputs' [min, max]")
            ordered.append({name: list(shapes[name]) for name in inputs})
        return ordered

    def points(self) -> dict[str, dict[str, list[int]]]:
        """The named shapes to verify and time: min, opt, max, then each extra shape (named by its dims).

        A shape equal to an earlier one is listed once, under the earlier name.
        """
        named: dict[str, dict[str, list[int]]] = {}
        for point in PROFILE_POINTS:
            shapes = {name: spec.dims(point) for name, spec in self.inputs.items()}
            if shapes not in named.values():
                named[point] = shapes
        for shapes in self.shapes:
            if shapes not in named.values():
                named[shape_slug(shapes)] = shapes
        return named

    @field_validator("inputs")
    @classmethod
    def _inputs(cls, value: dict[str, InputSpec]) -> dict[str, InputSpec]:
        _require_some(value, "a network needs at least one input")
        return value

    @field_validator("outputs")
    @classmethod
    def _outputs(cls, value: list[str]) -> list[str]:
        _require_some(value, "a network needs at least one output name")
        if len(set(value)) != len(value):
            raise ValueError(f"output names must be unique, got {value}")
        return value


class ModelSpec(Strict):
    factory: str | None = None
    sb3: str | None = None           # an SB3 model.save() zip and its VecNormalize .pkl, relative to the recipe
    vecnormalize: str | None = None
    kwargs: dict[str, Any] = Field(default_factory=dict)
    checkpoint: str | None = None
    seed: int = 0

    @field_validator("factory")
    @classmethod
    def _factory(cls, value: str | None) -> str | None:
        target, sep, attr = (value or ":").rpartition(":")
        if value is not None and (not sep or not target or not attr):
            raise ValueError(f"'{value}' is not 'pkg.module:callable' or 'path/to/file.py:callable'")
        return value
    @model_validator(mode="after")
    def _one_source(self) -> ModelSpec:
        if (self.factory is None) == (self.sb3 is None):
            raise ValueError("give exactly one of 'factory' (a Python callable) or 'sb3' (an agent zip)")
        if self.vecnormalize is not None and self.sb3 is None:
            raise ValueError("'vecnormalize' goes only with 'sb3'")
        return self


class OnnxConfig(Strict):
    opset: int = Field(default=17, ge=13, le=21)


class ReducedPrecisionTolerance(Strict):
    atol: float = Field(default=1.0e-2, ge=0)
    rtol: float = Field(default=1.0e-2, ge=0)
    max_kl: float = Field(default=1.0e-3, ge=0)


class RolloutConfig(Strict):
    env: str
    steps: int = Field(default=1000, ge=1)
    seed: int = 0

REDUCED_PRECISIONS: tuple[str, ...] = ("fp16", "bf16", "int8", "tf32")  # tf32: fp32 layers with 10-bit mantissas


class VerifyConfig(Strict):
    samples: int = Field(default=32, ge=1, le=1024)
    atol: float = Field(default=1.0e-4, ge=0)
    rtol: float = Field(default=1.0e-3, ge=0)
    max_kl: float = Field(default=1.0e-4, ge=0)
    seed: int = 0
    # steps per sample for networks with recurrent `state` (each step feeds the backend's own state back)
    steps: int = Field(default=4, ge=1, le=64)
    # Gate for artifacts built in reduced precision (fp16/bf16 engines, int8 ONNX Runtime).
    reduced_precision: ReducedPrecisionTolerance = Field(default_factory=lambda: ReducedPrecisionTolerance())
    rollout: RolloutConfig | None = None   # SB3 agents: run the env, every backend of `actor` vs predict (section 9)
    max_drift_kl: float | None = Field(default=None, ge=0)  # `rlopt refit`: a larger mean KL(old || new) exits 1

    def gate_for(self, precision_built: str | None) -> tuple[Tolerance, ParityGate | None]:
        """The tolerances an artifact built in `precision_built` is gated by: `reduced_precision` for a reduced
        precision, returned as the artifact's `parity_gate` too (so `rlopt verify` re-checks with the same one),
        else the recipe's own."""
        if precision_built in REDUCED_PRECISIONS:
            reduced = self.reduced_precision
            gate = ParityGate(atol=reduced.atol, rtol=reduced.rtol, max_kl=reduced.max_kl,
                              why=f"built in {precision_built} (verify.reduced_precision)")
            return Tolerance(reduced.atol, reduced.rtol, reduced.max_kl), gate
        return Tolerance(self.atol, self.rtol, self.max_kl), None


class RecipeSpec(Strict):
    """Every section but the backends' own: `rlopt.recipe.Recipe` adds one per registered backend."""

    name: str = Field(pattern=NAME_PATTERN)
    model: ModelSpec
    networks: dict[str, NetworkSpec]
    backends: list[str]
    pad_gemm: int | Literal["auto"] = "auto"
    # Also pad layers whose N cannot pass its padding on (the output head, a LayerNorm input) and slice back.
    pad_gemm_outputs: bool = False
    onnx: OnnxConfig = Field(default_factory=OnnxConfig)
    verify: VerifyConfig = Field(default_factory=VerifyConfig)
    # A warmup profile (contract section 6, path relative to the recipe) whose request shapes are built,
    # verified and tuned like `networks.<n>.shapes` of the network it names.
    warmup_profile: str | None = None
    ci: CiConfig = Field(default_factory=CiConfig)  # `rlopt diff` thresholds (contract section 15)

    @field_validator("networks")
    @classmethod
    def _networks(cls, value: dict[str, NetworkSpec]) -> dict[str, NetworkSpec]:
        import re

        _require_some(value, "a recipe needs at least one network")
        for name in value:
            if not re.match(NAME_PATTERN, name):
                raise ValueError(f"network name '{name}' must match {NAME_PATTERN} (it names a folder)")
        return value

    @field_validator("backends")
    @classmethod
    def _backends(cls, value: list[str]) -> list[str]:
        _require_some(value, "list at least one backend")
        return list(dict.fromkeys(value))

    @field_validator("pad_gemm")
    @classmethod
    def _pad(cls, value: int | str) -> int | str:
        if isinstance(value, int) and value < 0:
            raise ValueError("pad_gemm must be 0 (off), a positive multiple, or auto")
        return value

    def section(self, name: str) -> Any:
        """The recipe section named `name` (a backend's own: its `Backend.config` model)."""
        return getattr(self, name)

    def resolved_yaml(self) -> str:
        """The recipe with every default filled, as MODEL_DIR/recipe.yaml keeps it; the backends' sections follow
        `onnx`, in registry order."""
        document = self.model_dump(mode="json", exclude_none=True)
        own = [key for key in document if key not in type(self).backend_sections()]
        at = own.index("onnx") + 1 if "onnx" in own else len(own)
        order = own[:at] + [key for key in document if key not in own] + own[at:]
        return yaml.safe_dump({key: document[key] for key in order}, sort_keys=False)

    @classmethod
    def backend_sections(cls) -> tuple[str, ...]:
        """The sections a subclass adds for the backends (none here)."""
        return tuple(name for name in cls.model_fields if name not in RecipeSpec.model_fields)

    def sha256(self) -> str:
        return hashlib.sha256(self.resolved_yaml().encode()).hexdigest()


__all__ = ["DTYPES", "INTEGER_DTYPES", "PROFILE_POINTS", "REDUCED_PRECISIONS", "DType", "InputSpec", "Kind",
           "ModelSpec", "NetworkSpec", "OnnxConfig", "Precision", "ProfileRange", "RecipeSpec",
           "ReducedPrecisionTolerance", "RolloutConfig", "Strict", "VerifyConfig", "shape_problem", "shape_slug"]
