"""rlopt: compile RL policy and value networks into verified, deployable artifacts."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

__version__ = "0.5.0"

if TYPE_CHECKING:
    from pathlib import Path

    from rlopt.runtime import Session
    from rlopt.serve.batcher import Batcher


def load(model_dir: Any, network: str, backend: str = "auto", *, spinning: bool = True) -> Session:
    """Load one network of a compiled MODEL_DIR (see rlopt.runtime.load)."""
    from rlopt.runtime import load as _load

    return _load(model_dir, network, backend, spinning=spinning)


def refit(model_dir: Any, checkpoint: Any, out: Any = None) -> Path:
    """New weights into a compiled MODEL_DIR without recompiling, verified, published atomically (see rlopt.refit)."""
    from rlopt.refit import refit as _refit

    return _refit(model_dir, checkpoint, out)


def __getattr__(name: str) -> Any:
    """`rlopt.Batcher` (contract section 12), imported on first use: importing rlopt stays cheap."""
    if name == "Batcher":
        from rlopt.serve.batcher import Batcher

        return Batcher
    raise AttributeError(f"module 'rlopt' has no attribute {name!r}")


__all__ = ["Batcher", "load", "refit", "__version__"]
