"""Runner for `model.onnx`: one ONNX Runtime session with exactly the providers the build proved; one more per other
thread count `auto` gives some shapes (`facts.shape_threads`), or two, one thread and the default pool, where `auto`
asks for adaptive threads (adaptive.py)."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends.base import BoundCall, Runner
from rlopt.backends.onnxruntime.adaptive import SwitchLog, ThreadChoice
from rlopt.backends.onnxruntime.facts import CPU_PROVIDER, SECOND_SESSION_MAX_BYTES, OnnxRuntimeFacts
from rlopt.backends.onnxruntime.session import make_session
from rlopt.machine import usable_cores
from rlopt.manifest import shape_label

ONE_THREAD, POOL = "1 thread", "default pool"


def adaptive_allowed(path: Path) -> bool:
    """Opt-in (RLOPT_ORT_ADAPTIVE=1): under the bench protocol's frozen, short blocks the looks cost more than they
    found (docs/bench-command.md)."""
    return (os.environ.get("RLOPT_ORT_ADAPTIVE", "") not in ("", "0") and usable_cores() > 1
            and path.stat().st_size <= SECOND_SESSION_MAX_BYTES)


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
        self._sessions: dict[str, Any] = {}
        self._switches = SwitchLog()
        self._by_shape = self._shape_sessions(path, facts, spinning)
        if facts.adaptive_threads and not self._by_shape and self._cpu_only and facts.intra_op_threads in (None, 1) \
                and adaptive_allowed(Path(path)):
            one = facts.intra_op_threads == 1
            other = make_session(path, threads=None if one else 1, providers=facts.session_providers,
                                 spinning=spinning, provider_options=facts.provider_options)
            self._sessions = {ONE_THREAD: self._session, POOL: other} if one else \
                {POOL: self._session, ONE_THREAD: other}

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
        fall back from. Generated straight-line code builds the output dict (`dict(zip(...))` cost 0.3 us more).
        With two sessions, a ThreadChoice of this thread and signature picks the one that runs."""
        native = getattr(self._session_for([shape for shape, _ in signature]), "_sess", None)
        if not self._cpu_only or native is None or len(output_names) != len(self._output_names):
            return None
        namespace: dict[str, Any] = {"run": native.run, "fetched": self._output_names}
        namespace.update({f"n{k}": name for k, name in enumerate(output_names)})
        named = ", ".join(f"n{k}: out[{k}]" for k in range(len(output_names)))
        returned = f"return {{{named}}}\n"
        if not self._sessions:
            exec(f"def call(feeds, arrays):\n    out = run(fetched, feeds, None)\n    {returned}", namespace)
            return namespace["call"]  # type: ignore[no-any-return]
        runs = {name: session._sess.run for name, session in self._sessions.items()}
        label = "-".join("x".join(map(str, shape)) for shape, _ in signature)
        namespace["choice"] = ThreadChoice(runs, next(iter(runs)), label, self._switches.report)
        # the countdown and the serving run live in closure cells: a cell is cheaper to read than an attribute
        exec("def make():\n"
             "    left, run = choice.left, choice.run\n"
             "    def call(feeds, arrays):\n"
             "        nonlocal left, run\n"
             "        left -= 1\n"
             "        if left < 0:\n"
             "            out = choice.look(fetched, feeds)\n"
             "            left, run = choice.left, choice.run\n"
             "        else:\n"
             "            out = run(fetched, feeds, None)\n"
             f"        {returned}"
             "    return call\n", namespace)
        return namespace["make"]()  # type: ignore[no-any-return]

    def events(self) -> list[dict[str, Any]]:
        return list(self._switches.events)

    def close(self) -> None:
        self._session = None
        self._sessions, self._by_shape = {}, {}
