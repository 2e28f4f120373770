"""The warmup profile (contract section 6): a weighted request mix, validated like a recipe.

rlopt.recipe imports this module (a recipe may name a `warmup_profile`); it imports nothing from rlopt.recipe.

Validation is in two steps: the JSON's own shape (pydantic), then against the MODEL_DIR it
will drive (network, input names, rank, every dim inside the compiled [min, max]). Every
problem is one `ProfileError` line naming the file, the field and the fix (exit 2).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from rlopt.errors import ProfileError, explain_validation_error, located

if TYPE_CHECKING:
    from rlopt.manifest import Manifest


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Slo(_Strict):
    """Service-level objective on the steady-state p99 latency of the whole mix."""

    p99_ms: float = Field(gt=0, allow_inf_nan=False)


class RequestSpec(_Strict):
    """One kind of request: the input shapes, and how often it comes relative to the others."""

    weight: float = Field(gt=0, allow_inf_nan=False)
    shapes: dict[str, list[int]]

    @field_validator("shapes")
    @classmethod
    def _shapes(cls, value: dict[str, list[int]]) -> dict[str, list[int]]:
        if not value:
            raise ValueError("give the shape of every input, e.g. {\"input0\": [1, 1, 768]}")
        return value


class WarmupProfile(_Strict):
    network: str
    requests: list[RequestSpec] = Field(min_length=1)
    duration_s: float = Field(default=60.0, gt=0, allow_inf_nan=False)
    concurrency: int = Field(default=1, ge=1, le=1024)
    slo: Slo | None = None

    def distinct_shapes(self) -> list[dict[str, list[int]]]:
        """Each distinct request shape once, in the order the profile first names it."""
        seen: list[dict[str, list[int]]] = []
        for request in self.requests:
            if request.shapes not in seen:
                seen.append(request.shapes)
        return seen


def read_profile(path: Path | str) -> WarmupProfile:
    """Parse the JSON file and check its own structure (nothing about a MODEL_DIR yet)."""
    path = Path(path)
    if not path.is_file():
        raise ProfileError(located(path, "", "warmup profile not found", "check the --profile path"))
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except UnicodeDecodeError:
        raise ProfileError(located(path, "", "not UTF-8 text", "give a JSON warmup profile")) from None
    except json.JSONDecodeError as exc:
        raise ProfileError(located(path, f"line {exc.lineno}, column {exc.colno}", f"invalid JSON: {exc.msg}",
                                   "fix the syntax there")) from None
    if not isinstance(document, dict):
        raise ProfileError(located(path, "(top level)", f"expected a JSON object, got {type(document).__name__}",
                                   "write the profile as {\"network\": ..., \"requests\": [...]}"))
    try:
        return WarmupProfile.model_validate(document)
    except ValidationError as exc:
        raise ProfileError(explain_validation_error(path, exc)) from None


def check_against(profile: WarmupProfile, manifest: Manifest, path: Path | str, model_dir: Path | str) -> None:
    """Every request must be a shape the compiled network accepts; else one located line."""
    if profile.network not in manifest.networks:
        known = ", ".join(sorted(manifest.networks))
        raise ProfileError(located(path, "network", f"'{profile.network}' is not a network of {model_dir}",
                                   f"use one of: {known}"))
    inputs = manifest.networks[profile.network].inputs
    for index, request in enumerate(profile.requests):
        field = f"requests.{index}.shapes"
        unknown = sorted(set(request.shapes) - set(inputs))
        if unknown:
            raise ProfileError(located(path, f"{field}.{unknown[0]}",
                                       f"network '{profile.network}' has no input '{unknown[0]}'",
                                       f"use its inputs: {', '.join(inputs)}"))
        missing = sorted(set(inputs) - set(request.shapes))
        if missing:
            raise ProfileError(located(path, field, f"no shape for input '{missing[0]}'",
                                       f"give every input of '{profile.network}': {', '.join(inputs)}"))
        for name, dims in request.shapes.items():
            bounds = inputs[name]
            if len(dims) != len(bounds.min):
                raise ProfileError(located(path, f"{field}.{name}",
                                           f"rank {len(dims)} {dims}, but the network takes rank {len(bounds.min)}",
                                           f"give {len(bounds.min)} dims between {bounds.min} and {bounds.max}"))
            for axis, (dim, lo, hi) in enumerate(zip(dims, bounds.min, bounds.max)):
                if not lo <= dim <= hi:
                    raise ProfileError(located(path, f"{field}.{name}",
                                               f"{dims} is outside the compiled profile (dim {axis} is {dim}, "
                                               f"allowed [{lo}, {hi}])",
                                               f"stay between min {bounds.min} and max {bounds.max}, or recompile "
                                               "with a wider range"))


def load_profile(path: Path | str, manifest: Manifest, model_dir: Path | str) -> WarmupProfile:
    """Read a profile and check it against the MODEL_DIR it will drive."""
    profile = read_profile(path)
    check_against(profile, manifest, path, model_dir)
    return profile


__all__ = ["RequestSpec", "Slo", "WarmupProfile", "check_against", "explain_validation_error", "load_profile",
           "read_profile"]
