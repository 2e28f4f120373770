"""The backend registry: adding a backend is one package under rlopt/backends/ and one line in BACKENDS.

Importing this package imports no backend library; a runner's module is imported when it is opened.
`DEFAULT_BACKENDS` is what a recipe that omits `backends` builds: a fixed set, so registering a backend changes
no such recipe (contract section 14).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any, Callable

from rlopt.backends import onnxruntime, openvino, tensorrt, torchscript, tvm
from rlopt.backends.base import Runner, module_missing
from rlopt.backends.capability import Backend
from rlopt.errors import BackendUnavailable
from rlopt.facts import ArtifactFacts

BACKENDS: dict[str, Backend] = {b.name: b for b in (
    torchscript.BACKEND,
    onnxruntime.BACKEND,
    tvm.BACKEND,
    tensorrt.BACKEND,
    openvino.BACKEND,
)}
# What a recipe that omits `backends` builds (contract section 14): a backend registered later joins a recipe only
# when the recipe names it.
DEFAULT_BACKENDS: tuple[str, ...] = ("torchscript", "onnxruntime", "tvm", "tensorrt")

# The front end's libraries: every stage runs them (ONNX Runtime checks the padded graph against the exported one).
FRONT_END_DISTRIBUTIONS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("torch", ("torch",)), ("onnx", ("onnx",)), ("numpy", ("numpy",)),
    ("onnxruntime", ("onnxruntime", "onnxruntime-gpu")))


def _versions(declared: Iterable[tuple[str, tuple[str, ...]]]) -> dict[str, str | None]:
    from rlopt import __version__
    from rlopt.lazy import version_of

    versions: dict[str, str | None] = {"rlopt": __version__}
    for key, distributions in declared:
        if key not in versions:
            versions[key] = next(filter(None, map(version_of, distributions)), None)
    return versions


def tool_versions() -> dict[str, str | None]:
    """rlopt's version and each library's: the front end's, each registered backend's `distributions`, pydantic.
    What a manifest records and `rlopt inspect` shows."""
    return _versions([*FRONT_END_DISTRIBUTIONS, *(d for b in BACKENDS.values() for d in b.distributions),
                      ("pydantic", ("pydantic",))])


def stage_versions(backend: str | None = None) -> dict[str, str | None]:
    """The library versions a stage's cache key holds: rlopt's and the front end's, and for a backend's stage (its
    build, its verification) that backend's declared distributions. A new version of a backend's library rebuilds
    its stages and no other's; installing an optional backend keeps every other cache entry."""
    declared = BACKENDS[backend].distributions if backend in BACKENDS else ()
    return _versions([*FRONT_END_DISTRIBUTIONS, *declared])


RunnerFactory = Callable[[Path, list[str], Any], Runner]
FactsLike = ArtifactFacts | Mapping[str, Any] | None


def _lazy_factory(backend: Backend) -> RunnerFactory:
    return lambda path, names, facts: backend.runner_class()(path, names, facts)


RUNNERS: dict[str, RunnerFactory] = {name: _lazy_factory(b) for name, b in BACKENDS.items()}


def facts_of(backend: str, facts: FactsLike) -> ArtifactFacts:
    """An artifact's facts as its backend's typed model (ArtifactFacts for a backend this rlopt does not know).

    Raises pydantic's ValidationError on a declared fact of the wrong type; `read_manifest` has already checked
    the facts of every artifact it read, so from a loaded manifest this never raises.
    """
    model = BACKENDS[backend].facts if backend in BACKENDS else ArtifactFacts
    return model.of(facts)


def unavailable_reason(backend: str, facts: FactsLike = None) -> str | None:
    """None when `backend` can run here, else one line saying why not. Imports nothing heavy."""
    if backend not in BACKENDS:
        return f"no runtime for '{backend}' on this machine"
    return BACKENDS[backend].unavailable(facts_of(backend, facts))


def runtime_only_process() -> list[str]:
    """This process only runs artifacts (refit, verify, warmup): each backend whose library is not imported yet
    gets its `runtime_env`, so it loads its runtime alone (TVM: libtvm_runtime without the 259 MB compiler, ~0.5 s
    less per process). A setting the user made is kept. Returns the settings applied."""
    import os
    import sys

    applied = []
    for backend in BACKENDS.values():
        if backend.module in sys.modules:
            continue
        for name, value in backend.runtime_env:
            if name not in os.environ:
                os.environ[name] = value
                applied.append(f"{name}={value}")
    return applied


def import_before_torch(backends: Iterable[str]) -> None:
    """Import the libraries of `backends` that load faster before torch (rlopt.lazy.LOAD_BEFORE_TORCH) and can
    run here, so that opening a MODEL_DIR's runners (TorchScript's imports torch) costs the least."""
    from rlopt.lazy import LOAD_BEFORE_TORCH, require

    for name in backends:
        backend = BACKENDS.get(name)
        if backend is not None and backend.module in LOAD_BEFORE_TORCH and module_missing(backend.module) is None:
            require(backend.module)


def open_runner(backend: str, path: Path, input_names: list[str], facts: FactsLike) -> Runner:
    """Open `path` with `backend`'s runner after its availability rule passed; the runner gets typed facts."""
    typed = facts_of(backend, facts)
    reason = BACKENDS[backend].unavailable(typed) if backend in BACKENDS else unavailable_reason(backend)
    if reason is not None:
        raise BackendUnavailable(f"backend '{backend}' cannot run here: {reason}")
    return RUNNERS[backend](path, input_names, typed)


__all__ = ["BACKENDS", "DEFAULT_BACKENDS", "FRONT_END_DISTRIBUTIONS", "RUNNERS", "Backend", "Runner", "facts_of",
           "import_before_torch", "open_runner", "stage_versions", "tool_versions", "unavailable_reason"]
