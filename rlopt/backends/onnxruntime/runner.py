"""Runner for `model.onnx`: one ONNX Runtime session with exactly the providers the build proved, and one more per
other thread count `auto`'s route gives some shapes (`facts.shape_threads`)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends.base import BoundCall, Runner
from rlopt.arrays import shape_label
from rlopt.backends.onnxruntime.facts import CPU_PROVIDER, OnnxRuntimeFacts
from rlopt.onnx_session import make_session


class OnnxRuntimeRunner(Runner):
    def __init__(self, path: Path, input_names: list[str], facts: OnnxRuntimeFacts | Mapping[str, Any]) -> None:
        facts = OnnxRuntimeFacts.of(facts)
        self.input_names = input_names
        # allow_spinning is False when `auto` has this session share the cores with TVM's pool
        spinning = False if facts.allow_spinning is False else None
        self._session = make_session(path, threads=facts.intra_op_threads, providers=facts.session_providers,
                                     spinning=spinning, provider_options=facts.provider_options)
        self._output_names = [o.name for o in self._session.get_outputs()]
        self._cpu_only = facts.session_providers == [CPU_PROVIDER]
        self._by_shape = self._shape_sessions(path, facts, spinning)

    def _shape_sessions(self, path: Path, facts: OnnxRuntimeFacts, spinning: bool | None) -> dict[str, Any]:
        """Shape label -> the session with that shape's own thread count, one session per count."""
        by_threads: dict[int | None, Any] = {facts.intra_op_threads or None: self._session}
        by_shape = {}
        for label, threads in facts.shape_threads.items():
            count = threads or None
            if count not in by_threads:
                by_threads[count] = make_session(path, threads=count, providers=facts.session_providers,
                                                 spinning=spinning, provider_options=facts.provider_options)
            if by_threads[count] is not self._session:
                by_shape[label] = by_threads[count]
        return by_shape

    def _session_for(self, shapes: Any) -> Any:
        return self._by_shape.get(shape_label(shapes), self._session)

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        session = self._session_for([feeds[name].shape for name in self.input_names]) if self._by_shape \
            else self._session
        return list(session.run(self._output_names, feeds))

    def bound_call(self, signature: tuple[Any, ...], output_names: list[str]) -> BoundCall | None:
        """The session's C++ `run` on the caller's own feeds, straight from the Session's hot path:
        `InferenceSession.run` re-validates the feed names and wraps provider fallback on every call (~3 us of 12
        at batch 1 of a small MLP), which a checked signature does not need; a CPU-only session has no provider to
        fall back from. Generated straight-line code builds the output dict (`dict(zip(...))` cost 0.3 us more)."""
        native = getattr(self._session_for([shape for shape, _ in signature]), "_sess", None)
        if not self._cpu_only or native is None or len(output_names) != len(self._output_names):
            return None
        namespace: dict[str, Any] = {"run": native.run, "fetched": self._output_names}
        namespace.update({f"n{k}": name for k, name in enumerate(output_names)})
        named = ", ".join(f"n{k}: out[{k}]" for k in range(len(output_names)))
        exec(f"def call(feeds, arrays):\n    out = run(fetched, feeds, None)\n    return {{{named}}}\n", namespace)
        return namespace["call"]  # type: ignore[no-any-return]

    def close(self) -> None:
        self._session = None
        self._by_shape = {}
