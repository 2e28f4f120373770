"""The one interface the runtime, verify, bench and warmup call on a backend's runner."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np

from rlopt.facts import ArtifactFacts

Infer = Callable[[dict[str, np.ndarray]], list[np.ndarray]]
BoundCall = Callable[[dict[str, np.ndarray], Sequence[np.ndarray]], dict[str, np.ndarray]]


class Runner:
    """Opens one artifact, owns what it creates, runs numpy feeds.

    Subclasses implement `infer` and `close`; the other hooks have defaults that a backend
    overrides when it has something better (a per-thread bound call, extra code paths to gate).
    """

    input_names: list[str]

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise NotImplementedError

    def infer_ordered(self, arrays: Sequence[np.ndarray], signature: tuple[Any, ...] | None = None) -> list[np.ndarray]:
        """Inputs already in the network's order (the Session's hot path)."""
        return self.infer(dict(zip(self.input_names, arrays)))

    def bound_call(self, signature: tuple[Any, ...], output_names: list[str]) -> BoundCall | None:
        """A per-thread call specialised to one (shape, dtype) signature, or None when the backend has none. It
        takes the caller's feeds (exactly the network's inputs, contiguous, of this signature) and the same arrays
        in input order, and returns the named outputs: each backend reads whichever form it consumes."""
        return None

    def parity_variants(self) -> dict[str, Infer]:
        """Code paths `infer` may skip on the reference shapes; each must pass the parity gate."""
        return {}

    def gated_variants(self) -> dict[str, Infer]:
        """Optional tricks, used only where the parity gate passed them."""
        return {}

    def events(self) -> list[dict[str, Any]]:
        """What the runner changed about itself while running (e.g. TVM's pool re-sized), oldest first."""
        return []

    def warm_up(self, feeds: dict[str, np.ndarray]) -> None:
        """One call per shape before serving, so first-call costs are paid before traffic."""
        self.infer(feeds)

    def close(self) -> None:
        """Release what this runner created."""


def flatten_outputs(value: Any) -> list[Any]:
    """Tensors are leaves; tuples, lists and TVM Arrays of them are flattened in order."""
    if isinstance(value, (tuple, list)) or type(value).__name__ == "Array":
        return [leaf for item in value for leaf in flatten_outputs(item)]
    return [value]


@dataclass(frozen=True)
class RefitInputs:
    """What a backend's refit hook gets: a copy of the old network folder to rewrite in place.

    `network_dir` is the new MODEL_DIR's folder for this network (every old file already copied there);
    `artifact` is the backend's artifact path relative to it; `facts` its typed facts from the old manifest.
    `onnx_path` is the exported graph with the new weights (same graph, initializers replaced) and
    `padded_onnx_path` its pad_gemm copy when the network was padded (else None); `state` is the new
    state_dict as numpy arrays, keyed as the model's own `state_dict()`. The refit gates every artifact after its
    hook, against the re-recorded reference (written in the background meanwhile: no hook reads it).
    """

    network_dir: Path
    artifact: str
    facts: ArtifactFacts
    onnx_path: Path
    padded_onnx_path: Path | None
    state: dict[str, np.ndarray]


RefitHook = Callable[[RefitInputs], dict[str, Any]]


@dataclass(frozen=True)
class Backend:
    """Everything rlopt knows about one backend, importable without the backend's own library.

    `runner` is a "module:attribute" path, imported only when used; `stages` list the build's Stage classes. `facts` is the typed
    view of what its build records (an ArtifactFacts subclass); `unavailable` and `threads` take it.
    `unavailable` returns None when the backend's artifacts can run here, else one line saying why not.
    `threads` says how many threads the backend computes with, from the facts its build recorded.
    `stages` are the "module:Class" paths of its compile stages (rlopt.compile.stage.Stage), run in
    order after the front end; the artifact is the last applicable one's.
    `refit` is the "module:function" path of its RefitHook: it rewrites the artifact's weights in
    `RefitInputs.network_dir` without recompiling and returns the facts to record (the old ones, updated);
    None means this backend's artifacts cannot be refitted and `rlopt refit` refuses them.
    `runtime_env` are environment settings under which its library loads only what runs artifacts (for a process
    that never compiles: see rlopt.backends.runtime_only_process).
    `stall_floor` gives, per shape label, the latency a call falls back to when its thread pool stalls (a pool that
    hands each thread one fixed chunk waits for a descheduled thread); `auto` counts that shape at no less.
    `one_thread` takes an artifact's facts (a dict) and returns the facts to open a runner with that computes on its
    calling thread alone, after setting that thread up where the library keeps a pool per thread; refit then gates
    such artifacts side by side, one per core. None: the backend cannot, and refit gates it one network at a time.
    `triton_config` is the "module:function" path of a function that rewrites the generic Triton ModelConfig (a
    dict, rlopt.compile.triton.model_config) for a Triton backend with rules of its own; None: the generic one.
    """

    name: str
    module: str
    runner: str
    unavailable: Callable[[Any], str | None]
    threads: Callable[[Any], int | str]
    triton_platform: tuple[str, str] | None = None
    native: bool = False
    facts: type[ArtifactFacts] = ArtifactFacts
    stages: tuple[str, ...] = ()
    refit: str | None = None
    runtime_env: tuple[tuple[str, str], ...] = ()
    stall_floor: Callable[[Any], dict[str, float]] | None = None
    one_thread: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    triton_config: str | None = None

    def runner_class(self) -> type[Runner]:
        return _load(self.runner)  # type: ignore[no-any-return]

    def refit_hook(self) -> RefitHook | None:
        return _load(self.refit) if self.refit else None

    def triton_rules(self) -> Callable[[dict[str, Any]], dict[str, Any]] | None:
        return _load(self.triton_config) if self.triton_config else None


def _load(path: str) -> Any:
    from importlib import import_module

    module, attribute = path.split(":")
    return getattr(import_module(module), attribute)


def module_missing(module: str) -> str | None:
    from importlib.util import find_spec

    return None if find_spec(module) is not None else f"python module '{module}' is not installed"
