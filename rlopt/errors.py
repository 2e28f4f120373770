"""Typed errors, each mapped to the contract's exit code in one place (`exit_code`, read by `rlopt.cli.main`).

The one error policy, by whose fault it is:
- the user's (a recipe, profile, command line, model code, checkpoint, or a MODEL_DIR that is missing, corrupt or
  from an incompatible rlopt): RecipeError, UsageError, ProfileError, ArtifactError, and StageError from the front
  end (the model cannot be scripted or exported: no backend could build anything). One line naming the file, the
  field and the fix; exit 2.
- a backend's (its library missing or unable to start here, or unable to build, load or run this model):
  BackendUnavailable (skipped with the reason; `rlopt verify` says "unverified here"), StageError from a backend's
  own stage (skipped as "build failed: ...", and the compile fails: exit 1), an exception from a runner on recorded
  inputs (a failed verification naming the artifact: exit 1). VerificationError is a failed gate: exit 1.
- ours (a bug in rlopt): any other exception; `rlopt.cli.main` says so in one line with the log holding the
  traceback; exit 3.
Code that catches a library's `Exception` turns it into one of the above where it is caught, and says which in a
comment (tests/test_error_policy.py keeps every such site commented).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pydantic import ValidationError


class RloptError(Exception):
    """Base class: a one-line, user-facing message and the exit code it maps to."""

    exit_code: int = 2

    def __init__(self, message: str) -> None:
        super().__init__(" ".join(message.split()) if "\n" in message else message)


def located(file: object, field: str, problem: str, fix: str) -> str:
    """The one-line shape every user error takes: where, what, and how to fix it."""
    where = f"{file}: {field}" if field else f"{file}"
    return f"{where}: {problem}; fix: {fix}"


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (tool errors span many), or its type when it has none."""
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def describe_exception(exc: BaseException) -> str:
    """'TypeName: first line', for errors raised by code that is not rlopt's (user models, libraries)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0]}" if text else type(exc).__name__


class RecipeError(RloptError):
    """The recipe, its model code or its checkpoint is wrong (exit 2)."""


class UsageError(RloptError):
    """A command was called the wrong way (exit 2)."""


class ProfileError(RloptError):
    """A warmup profile is wrong (exit 2)."""


class StageError(RloptError):
    """A stage could not turn the user's model into its artifact. From the front end it ends the compile (exit 2);
    from a backend's stage it ends that backend: skipped as "build failed", and the compile fails (exit 1)."""


class ArtifactError(RloptError):
    """A MODEL_DIR is missing, corrupt, or from an incompatible version (exit 2)."""


class VerificationError(RloptError):
    """A built artifact does not match PyTorch, or a hash does not match (exit 1)."""

    exit_code = 1


class BackendUnavailable(RloptError):
    """A backend cannot run on this machine; the reason goes into the manifest as `skipped`, with the `facts` its
    build had settled before it stopped (TensorRT's plan), if any."""

    def __init__(self, message: str, facts: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.facts = dict(facts or {})


# the one-line explanation of a pydantic error, for every file rlopt validates (recipes, profiles)
_FIXES: dict[str, str] = {
    "extra_forbidden": "remove it or check its spelling",
    "missing": "add it",
    "literal_error": "use one of the listed values",
    "string_pattern_mismatch": "use only lowercase letters, digits, '_' and '-'",
    "int_parsing": "give a whole number",
    "int_type": "give a whole number",
    "float_parsing": "give a number",
    "float_type": "give a number",
    "list_type": "give a list, e.g. [1, 1, 768]",
    "dict_type": "give a mapping",
    "model_type": "give a mapping",
    "string_type": "give a string",
    "bool_type": "give true or false",
    "greater_than_equal": "raise it",
    "greater_than": "raise it",
    "less_than_equal": "lower it",
}


def _field_path(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc if not str(part).startswith(("function-", "literal[")))


def explain_validation_error(file: Path | str, exc: ValidationError) -> str:
    """The first pydantic error as one located line."""
    err = exc.errors()[0]
    field = _field_path(tuple(err["loc"])) or "(top level)"
    message = str(err["msg"]).removeprefix("Value error, ")
    if err["type"] == "extra_forbidden":
        message = "unknown field"
    fix = _FIXES.get(err["type"], "correct the value as the message says")
    if err["type"] == "value_error":
        message, _, given = message.partition("; fix: ")  # a validator may name its own fix
        fix = given or "see the message"
    return located(file, field, message, fix)
