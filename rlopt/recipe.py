"""The recipe (contract section 1): parsed from YAML, validated by pydantic, defaults filled.

Every problem becomes one `RecipeError` line naming the file, the field and the fix.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from rlopt.backends import BACKENDS as REGISTERED_BACKENDS
from rlopt.backends import DEFAULT_BACKENDS
from rlopt.backends.torchscript.config import TorchScriptConfig
from rlopt.ci_config import CiConfig
from rlopt.errors import RecipeError, explain_validation_error, located
from rlopt.yaml_file import load_yaml_mapping
from rlopt.manifest import shape_label

BACKENDS: tuple[str, ...] = tuple(REGISTERED_BACKENDS)  # in registry order: every name `backends` may list
DTYPES: tuple[str, ...] = ("float32", "float16", "float64", "int64", "int32", "uint8", "bool")
INTEGER_DTYPES: tuple[str, ...] = ("int64", "int32", "uint8")
NAME_PATTERN = r"^[a-z0-9_-]+$"

Backend = Literal[BACKENDS]  # type: ignore[valid-type]
DType = Literal["float32", "float16", "float64", "int64", "int32", "uint8", "bool"]
Precision = Literal["fp32", "fp16", "bf16", "int8"]
Kind = Literal["policy", "value", "generic"]
PROFILE_POINTS: tuple[str, ...] = ("min", "opt", "max")



def _require_some(value: Any, message: str) -> None:
    """The validators' shared refusal of an empty list or mapping."""
    if not value:
        raise ValueError(message)

class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=False)


class InputSpec(_Strict):
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


class ProfileRange(_Strict):
    """One input's min/opt/max inside an extra TensorRT optimization profile."""

    min: list[int]
    opt: list[int]
    max: list[int]


class NetworkSpec(_Strict):
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


class ModelSpec(_Strict):
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


class TvmConfig(_Strict):
    target: dict[str, Any] = Field(default_factory=lambda: {"kind": "llvm"})
    tune_trials: int = Field(default=0, ge=0)
    # kernels without a tuning record get rlopt's CPU schedules (rlopt.backends.tvm.schedules); false keeps TVM's
    # default loop nests for them (serial, scalar: 10-100x slower beyond batch 1)
    schedule_rules: bool = True

    @field_validator("target")
    @classmethod
    def _target(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "kind" not in value:
            raise ValueError("a TVM target dict needs 'kind', e.g. {kind: llvm} or {kind: cuda, arch: sm_86}")
        return value


class TensorRTConfig(_Strict):
    precision: Precision = "fp32"
    # TensorRT lets fp32 layers run in TF32 unless told not to; true allows it (recorded, gated like reduced precision)
    tf32: bool = False
    refittable: bool = False
    workspace_mb: int = Field(default=1024, gt=0)
    builder_optimization_level: int = Field(default=3, ge=0, le=5)
    timing_cache: str | None = None
    build_timeout_s: float = Field(default=1800.0, gt=0)


class OnnxConfig(_Strict):
    opset: int = Field(default=17, ge=13, le=21)

class OnnxRuntimeConfig(_Strict):
    providers: list[str] = Field(default_factory=lambda: ["CPUExecutionProvider"])
    # the CUDA provider's use_tf32 (on by default in ONNX Runtime): false keeps fp32 exact, true allows TF32
    tf32: bool = False


class ReducedPrecisionTolerance(_Strict):
    atol: float = Field(default=1.0e-2, ge=0)
    rtol: float = Field(default=1.0e-2, ge=0)
    max_kl: float = Field(default=1.0e-3, ge=0)


class RolloutConfig(_Strict):
    env: str
    steps: int = Field(default=1000, ge=1)
    seed: int = 0

class VerifyConfig(_Strict):
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


class Recipe(_Strict):
    name: str = Field(pattern=NAME_PATTERN)
    model: ModelSpec
    networks: dict[str, NetworkSpec]
    backends: list[Backend] = Field(default_factory=lambda: list(DEFAULT_BACKENDS))
    pad_gemm: int | Literal["auto"] = "auto"
    # Also pad layers whose N cannot pass its padding on (the output head, a LayerNorm input) and slice back.
    pad_gemm_outputs: bool = False
    onnx: OnnxConfig = Field(default_factory=OnnxConfig)
    onnxruntime: OnnxRuntimeConfig = Field(default_factory=OnnxRuntimeConfig)
    torchscript: TorchScriptConfig = Field(default_factory=TorchScriptConfig)
    tvm: TvmConfig = Field(default_factory=TvmConfig)
    tensorrt: TensorRTConfig = Field(default_factory=TensorRTConfig)
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

    def resolved_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False)

    def sha256(self) -> str:
        return hashlib.sha256(self.resolved_yaml().encode()).hexdigest()


def load_recipe(path: Path | str) -> Recipe:
    """Parse and validate a recipe file."""
    path = Path(path)
    document = load_yaml_mapping(path, "recipe")
    try:
        recipe = Recipe.model_validate(document)
    except ValidationError as exc:
        raise RecipeError(explain_validation_error(path, exc)) from None
    if recipe.warmup_profile:
        add_warmup_shapes(recipe, path)
    return recipe


def add_warmup_shapes(recipe: Recipe, path: Path) -> None:
    """Append the shapes of the recipe's warmup profile to the `shapes` of the network it drives."""
    from rlopt.errors import ProfileError
    from rlopt.tools.warmup.profile import read_profile

    assert recipe.warmup_profile is not None
    profile_path = path.parent / recipe.warmup_profile
    if not profile_path.is_file():
        raise RecipeError(located(path, "warmup_profile", f"{profile_path} not found",
                                  "give a warmup profile path relative to the recipe, or drop the field"))
    try:
        profile = read_profile(profile_path)
    except ProfileError as exc:
        raise RecipeError(str(exc)) from None
    spec = recipe.networks.get(profile.network)
    if spec is None:
        raise RecipeError(located(profile_path, "network", f"'{profile.network}' is not a network of {path.name}",
                                  f"use one of {sorted(recipe.networks)}"))
    for index, request in enumerate(profile.requests):
        problem = shape_problem(request.shapes, spec.inputs)
        if problem:
            raise RecipeError(located(profile_path, f"requests[{index}].shapes", problem,
                                      f"keep the warmup profile inside networks.{profile.network}'s profile"))
        shapes = {name: list(request.shapes[name]) for name in spec.inputs}
        if shapes not in spec.shapes:
            spec.shapes.append(shapes)
