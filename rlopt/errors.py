"""Typed errors, each mapped to the contract's exit code in one place (`exit_code`)."""

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
    """A stage could not turn the user's model into its artifact (exit 2)."""


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
