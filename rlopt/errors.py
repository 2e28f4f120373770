"""Typed errors, each mapped to the contract's exit code in one place (`exit_code`)."""

from __future__ import annotations


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
    """A backend cannot run on this machine; the reason goes into the manifest as `skipped`."""
