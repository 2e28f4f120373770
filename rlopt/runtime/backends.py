"""One runner per backend: open an artifact that has already passed its hash check, run numpy feeds.

A runner owns what it creates (session, VM, module) and nothing else. Heavy modules are
imported only when a runner of that backend is opened.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from rlopt.errors import ArtifactError, BackendUnavailable, located
from rlopt.lazy import require
from rlopt.machine import gpu_absent_reason
from rlopt.runtime.outputs import flatten_outputs
from rlopt.runtime.tensorrt_runner import TensorRTRunner


class Runner(Protocol):
    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]: ...

    def close(self) -> None: ...


class TorchScriptRunner:
    def __init__(self, path: Path, input_names: list[str], facts: dict[str, Any]) -> None:
        torch = require("torch")
        self._torch = torch
        self._names = input_names
        try:
            self._module = torch.jit.load(str(path), map_location="cpu").eval()
        except RuntimeError as exc:
            raise ArtifactError(located(path, "", f"not a loadable TorchScript file ({str(exc).splitlines()[0]})",
                                        "recompile MODEL_DIR")) from None

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self._torch
        with torch.inference_mode():
            result = self._module(*[torch.from_numpy(feeds[name]) for name in self._names])
        return [t.detach().numpy() for t in flatten_outputs(result)]

    def close(self) -> None:
        self._module = None


class OnnxRuntimeRunner:
    def __init__(self, path: Path, input_names: list[str], facts: dict[str, Any]) -> None:
        ort = require("onnxruntime")
        providers = list(facts.get("providers") or ["CPUExecutionProvider"])
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        threads = facts.get("intra_op_threads")
        if threads:
            options.intra_op_num_threads = int(threads)
        options.log_severity_level = 3
        if facts.get("allow_spinning") is False:  # set by `auto` when this session shares the cores with TVM's pool
            options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        try:
            self._session = ort.InferenceSession(str(path), sess_options=options, providers=providers)
        except Exception as exc:  # onnxruntime raises its own untyped errors for a corrupt model
            raise ArtifactError(located(path, "", f"ONNX Runtime cannot load it ({str(exc).splitlines()[0]})",
                                        "recompile MODEL_DIR")) from None
        missing = [p for p in providers if p not in self._session.get_providers()]
        if missing:
            raise BackendUnavailable(
                f"ONNX Runtime provider(s) {missing} requested but the session has only "
                f"{self._session.get_providers()}; fix: install onnxruntime-gpu on a GPU machine or "
                f"request CPUExecutionProvider"
            )
        self._output_names = [o.name for o in self._session.get_outputs()]

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self._session.run(self._output_names, feeds))

    def close(self) -> None:
        self._session = None


def tvm_device_kind(target: dict[str, Any]) -> str:
    return "cuda" if target.get("kind") == "cuda" else "cpu"


# TVM: exact-shape dispatch over tuned static libraries, dynamic fallback, zero-copy call path
from rlopt.runtime.tvm_runner import TvmRunner  # noqa: E402

RunnerFactory = Callable[[Path, list[str], dict[str, Any]], Runner]

RUNNERS: dict[str, RunnerFactory] = {
    "torchscript": TorchScriptRunner,
    "onnxruntime": OnnxRuntimeRunner,
    "tvm": TvmRunner,
    "tensorrt": TensorRTRunner,
}


def unavailable_reason(backend: str, facts: dict[str, Any] | None = None) -> str | None:
    """None when `backend` can run here, else one line saying why not. Imports nothing heavy."""
    from importlib.util import find_spec

    facts = facts or {}
    module = {"torchscript": "torch", "onnxruntime": "onnxruntime", "tvm": "tvm", "tensorrt": "tensorrt"}[backend]
    if find_spec(module) is None:
        return f"python module '{module}' is not installed"
    if backend == "tensorrt" or (backend == "tvm" and tvm_device_kind(facts.get("target", {})) == "cuda"):
        return gpu_absent_reason()
    if backend == "onnxruntime":
        wanted = [p for p in facts.get("providers", []) if p != "CPUExecutionProvider"]
        if wanted and gpu_absent_reason():
            return f"providers {wanted} need a GPU: {gpu_absent_reason()}"
    if backend == "tvm" and facts.get("cpu_features"):
        from rlopt.runtime.cpu_features import missing_features

        lacking = missing_features(list(facts["cpu_features"]))
        if lacking:
            return f"built for mcpu '{facts.get('target', {}).get('mcpu')}', this CPU lacks {', '.join(lacking[:6])}"
    if backend not in RUNNERS:
        return f"no runtime for '{backend}' on this machine"
    return None


def open_runner(backend: str, path: Path, input_names: list[str], facts: dict[str, Any]) -> Runner:
    reason = unavailable_reason(backend, facts)
    if reason is not None:
        raise BackendUnavailable(f"backend '{backend}' cannot run here: {reason}")
    return RUNNERS[backend](path, input_names, facts)
