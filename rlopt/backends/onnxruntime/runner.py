"""Runner for `model.onnx`: one ONNX Runtime session with exactly the providers the build proved."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends.base import Runner
from rlopt.backends.onnxruntime.facts import OnnxRuntimeFacts
from rlopt.backends.onnxruntime.session import make_session


class OnnxRuntimeRunner(Runner):
    def __init__(self, path: Path, input_names: list[str], facts: OnnxRuntimeFacts | Mapping[str, Any]) -> None:
        facts = OnnxRuntimeFacts.of(facts)
        self.input_names = input_names
        # allow_spinning is False when `auto` has this session share the cores with TVM's pool
        self._session = make_session(path, threads=facts.intra_op_threads, providers=facts.session_providers,
                                     spinning=False if facts.allow_spinning is False else None)
        self._output_names = [o.name for o in self._session.get_outputs()]

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self._session.run(self._output_names, feeds))

    def close(self) -> None:
        self._session = None
