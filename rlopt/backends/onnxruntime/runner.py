"""Runner for `model.onnx`: one ONNX Runtime session with exactly the providers the build proved."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends.base import Runner
from rlopt.errors import ArtifactError, BackendUnavailable, located
from rlopt.lazy import require


class OnnxRuntimeRunner(Runner):
    def __init__(self, path: Path, input_names: list[str], facts: dict[str, Any]) -> None:
        self.input_names = input_names
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
