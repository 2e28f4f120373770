"""Runner for `model.onnx`: one ONNX Runtime session with exactly the providers the build proved."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends.base import BoundCall, Runner
from rlopt.backends.onnxruntime.facts import CPU_PROVIDER, OnnxRuntimeFacts
from rlopt.backends.onnxruntime.session import make_session


class OnnxRuntimeRunner(Runner):
    def __init__(self, path: Path, input_names: list[str], facts: OnnxRuntimeFacts | Mapping[str, Any]) -> None:
        facts = OnnxRuntimeFacts.of(facts)
        self.input_names = input_names
        # allow_spinning is False when `auto` has this session share the cores with TVM's pool
        self._session = make_session(path, threads=facts.intra_op_threads, providers=facts.session_providers,
                                     spinning=False if facts.allow_spinning is False else None)
        self._output_names = [o.name for o in self._session.get_outputs()]
        self._cpu_only = facts.session_providers == [CPU_PROVIDER]

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return list(self._session.run(self._output_names, feeds))

    def bound_call(self, signature: tuple[Any, ...], output_names: list[str]) -> BoundCall | None:
        """The session's C++ `run` on the caller's own feeds, straight from the Session's hot path:
        `InferenceSession.run` re-validates the feed names and wraps provider fallback on every call (~3 us of 12
        at batch 1 of a small MLP), which a checked signature does not need; a CPU-only session has no provider to
        fall back from. Generated straight-line code builds the output dict (`dict(zip(...))` cost 0.3 us more)."""
        native = getattr(self._session, "_sess", None)
        if not self._cpu_only or native is None or len(output_names) != len(self._output_names):
            return None
        namespace: dict[str, Any] = {"run": native.run, "fetched": self._output_names}
        namespace.update({f"n{k}": name for k, name in enumerate(output_names)})
        named = ", ".join(f"n{k}: out[{k}]" for k in range(len(output_names)))
        exec(f"def call(feeds, arrays):\n    out = run(fetched, feeds, None)\n    return {{{named}}}", namespace)
        return namespace["call"]  # type: ignore[no-any-return]

    def close(self) -> None:
        self._session = None
