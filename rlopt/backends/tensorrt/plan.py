"""The TensorRT build plan: the network's shape profiles plus precision and builder settings, checked before any
build.

The profiles are the front end's (`rlopt.stages.profiles`: validated against the ONNX graph on every machine); the
settings come from the recipe's `tensorrt` section and the network's precision. Needs no TensorRT and no GPU.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlopt.backends.tensorrt.config import TensorRTConfig
from rlopt.spec import NetworkSpec, Precision
from rlopt.stages.profiles import (Batching, OnnxInput, OptimizationProfile, ShapeProfiles, ShapeRange,
                                   make_profiles, onnx_inputs)

# ONNX TensorProto element types by recipe dtype (onnx.TensorProto.FLOAT == 1, ...).
ONNX_ELEM_TYPES: dict[str, int] = {"float32": 1, "uint8": 2, "int32": 6, "int64": 7, "bool": 9, "float16": 10}


@dataclass(frozen=True)
class TensorRTPlan:
    """Everything a TensorRT build needs besides the ONNX file, validated."""

    shapes: ShapeProfiles
    precision: Precision
    precision_source: str
    workspace_bytes: int
    refittable: bool
    builder_optimization_level: int
    timing_cache: Path | None
    time_budget_s: float
    tf32: bool = False

    @property
    def network(self) -> str:
        return self.shapes.network

    @property
    def inputs(self) -> tuple[OnnxInput, ...]:
        return self.shapes.inputs

    @property
    def profiles(self) -> tuple[OptimizationProfile, ...]:
        return self.shapes.profiles

    @property
    def envelope(self) -> OptimizationProfile:
        """Profile 0: the inputs' own min/opt/max, which every other profile lies inside."""
        return self.shapes.envelope

    def batching(self) -> Batching:
        return self.shapes.batching()

    def facts(self) -> dict[str, Any]:
        return {
            "profiles": self.shapes.facts(),
            "precision": self.precision, "precision_source": self.precision_source,
            "workspace_mb": self.workspace_bytes >> 20, "refittable": self.refittable,
            "builder_optimization_level": self.builder_optimization_level,
            "timing_cache": str(self.timing_cache) if self.timing_cache else None,
            "time_budget_s": self.time_budget_s, "tf32": self.tf32,
        }


def effective_precision(spec: NetworkSpec, config: TensorRTConfig) -> tuple[Precision, str]:
    """The network's own `precision` when the recipe sets it, else the tensorrt section's default."""
    if "precision" in spec.model_fields_set:
        return spec.precision, f"networks.<name>.precision ({spec.precision})"
    return config.precision, f"tensorrt.precision ({config.precision})"


def make_plan(spec: NetworkSpec, config: TensorRTConfig, model: Any, *, recipe_path: Path,
              network: str) -> TensorRTPlan:
    """The validated plan for one network; every mismatch with the ONNX graph is a located RecipeError."""
    return plan_for(make_profiles(spec, model, recipe_path=recipe_path, network=network), spec, config,
                    recipe_path=recipe_path)


def plan_for(shapes: ShapeProfiles, spec: NetworkSpec, config: TensorRTConfig, *, recipe_path: Path) -> TensorRTPlan:
    """The plan for already validated profiles: the recipe's settings resolved (precision, timing cache path)."""
    precision, source = effective_precision(spec, config)
    cache = None
    if config.timing_cache:
        cache = Path(config.timing_cache)
        cache = cache if cache.is_absolute() else (Path(recipe_path).parent / cache)
    return TensorRTPlan(shapes=shapes, precision=precision,
                        precision_source=source.replace("<name>", shapes.network), workspace_bytes=config.workspace_mb << 20,
                        refittable=config.refittable, builder_optimization_level=config.builder_optimization_level,
                        timing_cache=cache, time_budget_s=config.build_timeout_s, tf32=config.tf32)


__all__ = ["ONNX_ELEM_TYPES", "Batching", "OnnxInput", "OptimizationProfile", "ShapeProfiles", "ShapeRange",
           "TensorRTPlan", "effective_precision", "make_plan", "onnx_inputs", "plan_for"]
