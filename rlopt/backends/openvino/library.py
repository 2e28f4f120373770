"""The OpenVINO library: its absence as one line with the install command, one Core per process, the settings
every compiled model gets."""

from __future__ import annotations

import importlib
import threading
from types import ModuleType
from typing import Any

from rlopt.backends.base import module_missing
from rlopt.backends.openvino.facts import OpenVinoFacts
from rlopt.errors import BackendUnavailable

INSTALL = "pip install 'rlopt[openvino]'"
_core: Any = None
_core_lock = threading.Lock()


def openvino_missing() -> str | None:
    """None when the `openvino` module can be imported here, else why not with the fix. Imports nothing."""
    missing = module_missing("openvino")
    return f"{missing}; fix: {INSTALL}" if missing else None


def import_openvino() -> ModuleType:
    """The `openvino` module, or BackendUnavailable saying how to install it."""
    missing = openvino_missing()
    if missing:
        raise BackendUnavailable(missing)
    try:
        return importlib.import_module("openvino")
    except ImportError as exc:
        raise BackendUnavailable(f"python module 'openvino' cannot be imported ({exc}); fix: {INSTALL}") from None


def shared_core() -> Any:
    """One `openvino.Core` per process (OpenVINO's advice: each Core loads its own device plugins)."""
    global _core
    if _core is None:
        ov = import_openvino()
        with _core_lock:
            if _core is None:
                _core = ov.Core()
    return _core


def compile_config(facts: OpenVinoFacts) -> dict[str, Any]:
    """The properties a compiled model gets: the performance hint, the inference precision always (a CPU with
    bf16 defaults to it, not to the IR's f32), and the threads when the facts fix them."""
    config: dict[str, Any] = {"PERFORMANCE_HINT": facts.performance_hint,
                              "INFERENCE_PRECISION_HINT": facts.inference_precision}
    if facts.inference_num_threads:
        config["INFERENCE_NUM_THREADS"] = int(facts.inference_num_threads)
    return config


__all__ = ["INSTALL", "compile_config", "import_openvino", "openvino_missing", "shared_core"]
