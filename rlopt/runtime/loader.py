"""`load`: manifest -> the backends a network needs -> checked artifacts -> runners -> a Session."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

from rlopt.backends import BACKENDS, Runner, facts_of, import_before_torch, open_runner, unavailable_reason
from rlopt.errors import ArtifactError, BackendUnavailable, UsageError, located
from rlopt.facts import ArtifactFacts
from rlopt.manifest import (
    MANIFEST_NAME,
    BackendRecord,
    Manifest,
    NetworkRecord,
    checked_file,
    checked_private_copy,
    read_manifest,
)
from rlopt.runtime.routes import ranked_backends, recorded_plan
from rlopt.runtime.session import Session

KNOWN_BACKENDS: tuple[str, ...] = tuple(BACKENDS)


def usable_backends(manifest: Manifest, model_dir: Path, network: str) -> list[str]:
    """Verified backends that can run on this machine, `selected` first, then by opt latency."""
    record = manifest.network(network, model_dir)
    usable, reasons = [], []
    for name in ranked_backends(record):
        reason = unavailable_reason(name, record.artifacts[name].facts)
        if reason is None:
            usable.append(name)
        else:
            reasons.append(f"{name}: {reason}")
    if not usable:
        raise ArtifactError(
            located(model_dir / MANIFEST_NAME, f"networks.{network}", "no verified backend can run on this machine"
                    + (f" ({'; '.join(reasons)})" if reasons else ""), "recompile on this machine")
        )
    return usable


def resolve_backend(manifest: Manifest, model_dir: Path, network: str, backend: str) -> str:
    record = manifest.network(network, model_dir)
    if backend == "auto":
        return usable_backends(manifest, model_dir, network)[0]
    if backend not in KNOWN_BACKENDS:
        raise UsageError(f"backend '{backend}' is unknown; fix: use auto or one of {', '.join(KNOWN_BACKENDS)}")
    artifact = record.artifacts.get(backend)
    where = f"networks.{network}.artifacts.{backend}"
    if artifact is None:
        raise ArtifactError(located(model_dir / MANIFEST_NAME, f"networks.{network}.artifacts",
                                    f"backend '{backend}' was not compiled", "add it to the recipe's backends"))
    if artifact.skipped:
        raise ArtifactError(located(model_dir / MANIFEST_NAME, where, f"skipped at compile time: {artifact.skipped}",
                                    "use another backend or auto"))
    facts = artifact.facts
    if facts.verified is False:
        raise ArtifactError(located(model_dir / MANIFEST_NAME, where, f"built but never verified: {facts.not_verified}",
                                    "recompile MODEL_DIR on a machine that can run it"))
    if not artifact.verified:
        raise ArtifactError(located(model_dir / MANIFEST_NAME, where, "failed verification at compile time",
                                    "fix the parity failure and recompile"))
    return backend


def open_artifact(model_dir: Path, backend: str, artifact: BackendRecord, input_names: list[str],
                  facts: ArtifactFacts | None = None) -> Runner:
    """Open a backend's artifact after its sha256 matches; native code is loaded from a checked private copy.

    `facts` (default: the artifact's own) lets the caller adjust how it runs (an `auto` route's options, as compile
    measured them); the files checked are always the ones the manifest lists.
    """
    typed = facts_of(backend, artifact.facts if facts is None else facts)
    if BACKENDS[backend].native:
        with tempfile.TemporaryDirectory(prefix="rlopt-load-") as private:
            for extra in typed.companion_files():  # TVM's per-shape libraries travel with the main one
                checked_private_copy(model_dir, extra, Path(private))
            return open_runner(backend, checked_private_copy(model_dir, artifact, Path(private)), input_names, typed)
    return open_runner(backend, checked_file(model_dir, artifact), input_names, typed)


def load(model_dir: str | Path, network: str, backend: str = "auto", *, spinning: bool = True) -> Session:
    """Load one network of a compiled MODEL_DIR; the artifact's sha256 is checked before it is opened.

    `auto` leaves out a backend whose runner cannot start here after all (its library present, yet, say, CUDA fails
    to initialise) and routes over the others, as if it had been unusable from the start. `spinning=False` opens
    every backend that can be told so (its `no_spin`) with pools that sleep between calls instead of spinning: for a
    process that shares its cores with other work between calls (`rlopt serve`: its event loop), where a spinning
    pool thread took CPU the requests needed."""
    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    if backend != "auto":
        fallback = resolve_backend(manifest, model_dir, network, backend)
        return _open(model_dir, network, manifest.networks[network], {}, fallback, {}, backend, spinning)
    record = manifest.network(network, model_dir)
    usable, failed = usable_backends(manifest, model_dir, network), []
    while True:
        plan = recorded_plan(record, usable)
        try:
            return _open(model_dir, network, record, plan.routes, plan.fallback, plan.options, backend, spinning)
        except _CannotStart as exc:
            usable = [name for name in usable if name != exc.backend]
            failed.append(f"{exc.backend}: {exc.reason}")
            if not usable:
                raise ArtifactError(located(model_dir / MANIFEST_NAME, f"networks.{network}",
                                            f"no verified backend can start on this machine ({'; '.join(failed)})",
                                            "recompile on this machine")) from None


class _CannotStart(Exception):
    def __init__(self, backend: str, reason: str) -> None:
        super().__init__(reason)
        self.backend, self.reason = backend, reason


def _open(model_dir: Path, network: str, record: NetworkRecord, routes: dict[Any, str], fallback: str,
          options: dict[str, dict[str, Any]], backend: str, spinning: bool = True) -> Session:
    """Open the runners a route needs, each with the facts its route opens it with (`options` over its artifact's);
    under `auto`, one that cannot start raises _CannotStart (the others closed)."""
    runners: dict[str, Runner] = {}
    opened = list(dict.fromkeys([fallback, *routes.values()]))
    import_before_torch(opened)
    try:
        for name in opened:
            artifact = record.artifacts[name]
            facts = artifact.facts.updated(**options[name]) if name in options else artifact.facts
            no_spin = BACKENDS[name].no_spin
            if not spinning and no_spin is not None:
                facts = no_spin(facts)
            try:
                runners[name] = open_artifact(model_dir, name, artifact, list(record.inputs), facts)
            except BackendUnavailable as exc:
                if backend != "auto":
                    raise
                raise _CannotStart(name, str(exc)) from None
    except BaseException:
        for runner in runners.values():
            runner.close()
        raise
    return Session(runners, routes, fallback, network, record,
                   reopen=lambda other: load(other, network, backend, spinning=spinning))


__all__ = ["KNOWN_BACKENDS", "load", "open_artifact", "resolve_backend", "usable_backends"]
