"""`rlopt compile`: recipe -> stages -> verified artifacts -> sealed manifest in MODEL_DIR.

Modules: `stage` (the Stage interface and per-network Context), `engine` (runs stages: timing,
progress, skips, the stage cache), `frontend` (model source -> script -> reference -> ONNX ->
checks -> padding), `network` (front end + each backend's registered stages + verify + Triton),
`measure` (the verify stage), `publish` (atomic MODEL_DIR), `driver` (`compile_recipe`).
Importing this package imports none of them; the names below load on first use.
"""

from __future__ import annotations

from typing import Any

_EXPORTS = {"compile_recipe": "rlopt.compile.driver", "CompileResult": "rlopt.compile.driver",
            "compile_agent": "rlopt.compile.driver", "Reporter": "rlopt.compile.engine", "tool_versions": "rlopt.backends"}


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        from importlib import import_module

        return getattr(import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'rlopt.compile' has no attribute '{name}'")


__all__ = list(_EXPORTS)
