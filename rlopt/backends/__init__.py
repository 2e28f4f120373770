"""The backend registry: adding a backend is one package under rlopt/backends/ and one line in BACKENDS.

Importing this package imports no backend library; a runner's module is imported when it is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from rlopt.backends import onnxruntime, tensorrt, torchscript, tvm
from rlopt.backends.base import Backend, Runner
from rlopt.errors import BackendUnavailable

BACKENDS: dict[str, Backend] = {b.name: b for b in (
    torchscript.BACKEND,
    onnxruntime.BACKEND,
    tvm.BACKEND,
    tensorrt.BACKEND,
)}

RunnerFactory = Callable[[Path, list[str], dict[str, Any]], Runner]


def _lazy_factory(backend: Backend) -> RunnerFactory:
    return lambda path, names, facts: backend.runner_class()(path, names, facts)


RUNNERS: dict[str, RunnerFactory] = {name: _lazy_factory(b) for name, b in BACKENDS.items()}


def unavailable_reason(backend: str, facts: dict[str, Any] | None = None) -> str | None:
    """None when `backend` can run here, else one line saying why not. Imports nothing heavy."""
    if backend not in BACKENDS:
        return f"no runtime for '{backend}' on this machine"
    return BACKENDS[backend].unavailable(facts or {})


def open_runner(backend: str, path: Path, input_names: list[str], facts: dict[str, Any]) -> Runner:
    reason = unavailable_reason(backend, facts)
    if reason is not None:
        raise BackendUnavailable(f"backend '{backend}' cannot run here: {reason}")
    return RUNNERS[backend](path, input_names, facts)


__all__ = ["BACKENDS", "Backend", "Runner", "RUNNERS", "open_runner", "unavailable_reason"]
