"""The one interface the runtime, verify, bench and warmup call on a backend's runner, and what a refit hook gets.

What a backend declares (its descriptor) is `rlopt.backends.capability.Backend`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from collections.abc import Sequence
from typing import Any, Callable

import numpy as np
from rlopt.arrays import flatten_outputs
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


RefitHook = Callable[[RefitInputs], ArtifactFacts]  # returns the facts to record: the old ones, updated


def module_missing(module: str) -> str | None:
    from importlib.util import find_spec

    return None if find_spec(module) is not None else f"python module '{module}' is not installed"


__all__ = ["BoundCall", "Infer", "RefitHook", "RefitInputs", "Runner", "flatten_outputs", "module_missing"]
