"""The user's PyTorch model from a recipe's `model` section: factory, kwargs, then checkpoint or seed.

Compile's front end, refit and bench's eager baseline all rebuild it this one way.
"""

from __future__ import annotations

import importlib
import importlib.util
import re
import sys
from pathlib import Path
from typing import Any

from rlopt.errors import RecipeError, describe_exception, located
from rlopt.lazy import require
from rlopt.files import sha256_file
from rlopt.spec import ModelSpec


def resolve_factory(spec: ModelSpec, recipe_path: Path) -> Any:
    target, _, attr = spec.factory.rpartition(":")
    field = "model.factory"
    if target.endswith(".py") or "/" in target:
        file = (recipe_path.parent / target).resolve()
        if not file.is_file():
            raise RecipeError(located(recipe_path, field, f"file '{target}' not found (looked at {file})",
                                      "give a path relative to the recipe"))
        module_name = f"rlopt_user_{file.stem}_{abs(hash(str(file))) % 10**8}"
        if module_name in sys.modules:
            module = sys.modules[module_name]
        else:
            loader_spec = importlib.util.spec_from_file_location(module_name, file)
            assert loader_spec is not None and loader_spec.loader is not None
            module = importlib.util.module_from_spec(loader_spec)
            sys.modules[module_name] = module
            try:
                loader_spec.loader.exec_module(module)
            except Exception as exc:  # the user's module may raise anything at import
                del sys.modules[module_name]
                raise RecipeError(located(recipe_path, field, f"importing '{target}' raised {describe_exception(exc)}",
                                          f"fix {file.name}")) from None
    else:
        try:
            module = importlib.import_module(target)
        except ImportError as exc:
            raise RecipeError(located(recipe_path, field, f"cannot import '{target}' ({exc})",
                                      "install the package or use 'path/to/file.py:callable'")) from None
        except Exception as exc:  # the user's module may raise anything at import
            raise RecipeError(located(recipe_path, field, f"importing '{target}' raised {describe_exception(exc)}",
                                      f"fix {target}")) from None
    factory = getattr(module, attr, None)
    if factory is None or not callable(factory):
        raise RecipeError(located(recipe_path, field, f"'{attr}' is not a callable in '{target}'",
                                  "name a class or function defined there"))
    return factory


def unreadable_checkpoint(path: Path, exc: BaseException) -> str:
    """Why torch.load(weights_only=True) or safetensors refused `path`, in a few words: torch's own message is a
    paragraph on its `weights_only` default that fits no one-line error."""
    text = str(exc)
    refused = re.search(r"Unsupported global: GLOBAL ([\w.]+)", text)
    if refused:
        return f"cannot read '{path.name}': it pickles {refused.group(1)}, not a state_dict of tensors"
    if "WeightsUnpickler error" in text or type(exc).__name__ in ("UnpicklingError", "BadZipFile", "EOFError") or \
            "PytorchStreamReader" in text:
        return f"cannot read '{path.name}': not a file torch.save wrote, or a damaged one ({type(exc).__name__})"
    return f"cannot read '{path.name}' as a weights-only state_dict ({describe_exception(exc)[:160]})"


def load_state_dict(path: Path, recipe_path: Path, field: str = "model.checkpoint") -> dict[str, Any]:
    """The state_dict in `path` (.pt through torch.load(weights_only=True), or .safetensors); every problem is one
    RecipeError line located at `recipe_path` / `field`."""
    torch = require("torch")
    if not path.is_file():
        raise RecipeError(located(recipe_path, field, f"checkpoint '{path}' not found", "give a path relative to the recipe"))
    try:
        if path.suffix == ".safetensors":
            from safetensors.torch import load_file

            state = load_file(str(path))
        else:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
    except Exception as exc:  # torch.load / safetensors raise many unrelated types for a bad file
        raise RecipeError(located(recipe_path, field, unreadable_checkpoint(path, exc),
                                  "save it with torch.save(model.state_dict(), path)")) from None
    if not isinstance(state, dict) or not all(isinstance(v, torch.Tensor) for v in state.values()):
        raise RecipeError(located(recipe_path, field, f"'{path.name}' is not a state_dict (name -> tensor)",
                                  "save it with torch.save(model.state_dict(), path)"))
    return state


def build_model(spec: ModelSpec, recipe_path: Path) -> tuple[Any, dict[str, Any]]:
    """The model in eval mode, and facts about how it was made."""
    torch = require("torch")
    factory = resolve_factory(spec, recipe_path)
    torch.manual_seed(spec.seed)
    try:
        model = factory(**spec.kwargs)
    except Exception as exc:  # the user's factory may raise anything
        raise RecipeError(located(recipe_path, "model.kwargs", f"{spec.factory}(**kwargs) raised {describe_exception(exc)}",
                                  "fix the kwargs or the factory")) from None
    if not isinstance(model, torch.nn.Module):
        raise RecipeError(located(recipe_path, "model.factory", f"{spec.factory} returned {type(model).__name__}, "
                                  "not a torch.nn.Module", "return the model instance"))
    facts: dict[str, Any] = {"factory": spec.factory, "seed": spec.seed}
    if spec.checkpoint:
        path = (recipe_path.parent / spec.checkpoint).resolve()
        state = load_state_dict(path, recipe_path)
        result = model.load_state_dict(state, strict=False)
        if result.missing_keys or result.unexpected_keys:
            problem = (f"keys do not match the model: missing {result.missing_keys[:3]}"
                       f"{'...' if len(result.missing_keys) > 3 else ''}, unexpected {result.unexpected_keys[:3]}"
                       f"{'...' if len(result.unexpected_keys) > 3 else ''}")
            raise RecipeError(located(recipe_path, "model.checkpoint", problem,
                                      "use a checkpoint saved from this model with these kwargs"))
        facts.update(checkpoint=spec.checkpoint, checkpoint_sha256=sha256_file(path))
    model.eval()
    facts["parameters"] = int(sum(p.numel() for p in model.parameters()))
    return model, facts


def submodule(model: Any, dotted: str, recipe_path: Path, network: str) -> Any:
    module = model
    for part in [p for p in dotted.split(".") if p]:
        if not hasattr(module, part):
            children = [name for name, _ in module.named_children()]
            raise RecipeError(located(recipe_path, f"networks.{network}.module",
                                      f"'{dotted}' has no attribute '{part}'",
                                      f"use a dotted path to a submodule, e.g. one of {children} ('' = whole model)"))
        module = getattr(module, part)
    torch = require("torch")
    if not isinstance(module, torch.nn.Module):
        raise RecipeError(located(recipe_path, f"networks.{network}.module", f"'{dotted}' is a {type(module).__name__}, "
                                  "not a torch.nn.Module", "point it at a submodule"))
    return module.eval()
