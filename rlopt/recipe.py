"""The recipe (contract section 1): parsed from YAML, validated by pydantic, defaults filled.

`Recipe` is the shared sections (`rlopt.spec.RecipeSpec`) plus one section per registered backend, each the
backend's own `Backend.config` model under the backend's name, as Olive's passes declare their options. A recipe
that omits `backends` gets `DEFAULT_BACKENDS`, a fixed set: a backend registered later joins only the recipes
that name it (contract section 14). Every problem becomes one `RecipeError` line naming the file, the field and
the fix.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, create_model

from rlopt.backends import BACKENDS as REGISTERED_BACKENDS, DEFAULT_BACKENDS
from rlopt.errors import RecipeError, explain_validation_error, located
from rlopt.spec import (DTYPES, INTEGER_DTYPES, NAME_PATTERN, PROFILE_POINTS, InputSpec, ModelSpec, NetworkSpec,
                        OnnxConfig, Precision, ProfileRange, RecipeSpec, VerifyConfig, shape_problem, shape_slug)
from rlopt.yaml_file import load_yaml_mapping

BACKENDS: tuple[str, ...] = tuple(REGISTERED_BACKENDS)  # every backend a recipe may name, in registry order

BackendName = Literal[BACKENDS]  # type: ignore[valid-type]


def _recipe_model() -> type[RecipeSpec]:
    sections: dict[str, Any] = {name: (backend.config, Field(default_factory=backend.config))
                                for name, backend in REGISTERED_BACKENDS.items() if backend.config is not None}
    return create_model(  # type: ignore[call-overload, no-any-return]
        "Recipe", __base__=RecipeSpec, __module__=__name__, __doc__="A recipe: the shared sections and each "
        "registered backend's own section (its Backend.config), named after the backend.",
        backends=(list[BackendName], Field(default_factory=lambda: list(DEFAULT_BACKENDS))), **sections)


Recipe = _recipe_model()


def load_recipe(path: Path | str) -> Any:
    """Parse and validate a recipe file (a `Recipe`)."""
    path = Path(path)
    document = load_yaml_mapping(path, "recipe")
    try:
        recipe = Recipe.model_validate(document)
    except ValidationError as exc:
        raise RecipeError(explain_validation_error(path, exc)) from None
    if recipe.warmup_profile:
        add_warmup_shapes(recipe, path)
    return recipe


def add_warmup_shapes(recipe: RecipeSpec, path: Path) -> None:
    """Append the shapes of the recipe's warmup profile to the `shapes` of the network it drives."""
    from rlopt.errors import ProfileError
    from rlopt.warmup_profile import read_profile

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


__all__ = ["BACKENDS", "DEFAULT_BACKENDS", "DTYPES", "INTEGER_DTYPES", "NAME_PATTERN", "PROFILE_POINTS", "BackendName",
           "InputSpec", "ModelSpec", "NetworkSpec", "OnnxConfig", "Precision", "ProfileRange", "Recipe", "VerifyConfig",
           "add_warmup_shapes", "load_recipe", "shape_problem", "shape_slug"]
