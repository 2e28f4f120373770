"""The new weights: the model rebuilt from the MODEL_DIR's recorded source, loaded from the checkpoint, checked.

A factory MODEL_DIR takes a state_dict (`.pt` / `.safetensors`, the loader of `model.checkpoint`); one compiled
from an SB3 zip takes a new zip of the same agent (and its VecNormalize statistics). Every mismatch with the
compiled architecture is one line naming the first bad key.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from rlopt.errors import UsageError, located
from rlopt.facts import ModelSourceFacts
from rlopt.recipe import ModelSpec, Recipe


def rebuild_command(recipe: Recipe, checkpoint: Path, out: Path) -> str:
    """The `rlopt compile` command that builds `out` from scratch with the new weights."""
    if recipe.model.sb3 is not None:
        return f"rlopt compile {checkpoint} -o {out}"
    return f"set model.checkpoint: {checkpoint} in the recipe and run 'rlopt compile RECIPE -o {out}'"


def _shape(value: Any) -> list[int]:
    return list(value.shape)


def check_state(expected: dict[str, Any], state: dict[str, Any], checkpoint: Path, what: str) -> None:
    """Same keys, shapes and dtypes as `expected` (the compiled module's state_dict), else the first bad key."""
    fix = f"give a checkpoint saved from {what}, or recompile for the new architecture"
    for key, value in expected.items():
        if key not in state:
            raise UsageError(located(checkpoint, f"key '{key}'", f"missing (the compiled {what} has it)", fix))
        new = state[key]
        if _shape(new) != _shape(value):
            raise UsageError(located(checkpoint, f"key '{key}'", f"shape {_shape(new)}, the compiled {what} has "
                                     f"{_shape(value)}", fix))
        if new.dtype != value.dtype:
            raise UsageError(located(checkpoint, f"key '{key}'", f"dtype {new.dtype}, the compiled {what} has "
                                     f"{value.dtype}", fix))
        if not value.is_floating_point() and not bool((new == value).all()):
            raise UsageError(located(checkpoint, f"key '{key}'", "an integer buffer changed; refit replaces "
                                     "floating-point weights only", "recompile with the new checkpoint"))
    extra = next((key for key in state if key not in expected), None)
    if extra is not None:
        raise UsageError(located(checkpoint, f"key '{extra}'", f"unexpected (the compiled {what} has no such key)",
                                 fix))


def factory_model(source: ModelSourceFacts, checkpoint: Path, model_dir: Path) -> Any:
    """The eager model from the recorded factory, with the checkpoint's weights (strict)."""
    from rlopt.user_model import build_model, load_state_dict

    if checkpoint.suffix.lower() == ".zip":
        raise UsageError(located(checkpoint, "--checkpoint", "an agent zip refits only a MODEL_DIR compiled from one",
                                 "give a state_dict (.pt or .safetensors) of the recipe's model"))
    if not checkpoint.is_file():
        raise UsageError(located(checkpoint, "--checkpoint", "not found", "give the path of the new state_dict"))
    spec = ModelSpec(factory=source.factory, kwargs=source.kwargs or {}, seed=source.seed or 0)
    model, _ = build_model(spec, model_dir / "recipe.yaml")
    state = load_state_dict(checkpoint, checkpoint, field="--checkpoint")
    check_state(model.state_dict(), state, checkpoint, "model")
    model.load_state_dict(state)
    return model.eval()


def agent_model(recipe: Recipe, checkpoint: Path, vecnormalize: Path | None) -> tuple[Any, Recipe]:
    """The actor and value modules of a new SB3 zip, and the recipe that names it (for the reference)."""
    from rlopt.compile.sources import Sb3Source

    if checkpoint.suffix.lower() != ".zip":
        raise UsageError(located(checkpoint, "--checkpoint", "this MODEL_DIR was compiled from an SB3 agent zip",
                                 "give the new agent's model.save() zip"))
    for path, flag in ((checkpoint, "--checkpoint"), (vecnormalize, "--vecnormalize")):
        if path is not None and not path.is_file():
            raise UsageError(located(path, flag, "not found", "give an existing file"))
    model = recipe.model.model_copy(update={"sb3": str(checkpoint.resolve()),
                                            "vecnormalize": str(vecnormalize.resolve()) if vecnormalize else None})
    recipe = recipe.model_copy(update={"model": model})
    loaded, _ = Sb3Source(recipe, checkpoint).load()
    return loaded, recipe


__all__ = ["agent_model", "check_state", "factory_model", "rebuild_command"]
