"""Server-side recurrent state: one state per live sequence (Triton's sequence_id / _start / _end parameters).

A network's `state` pairs (input -> the output fed back into it, contract section 8) come from its reference.npz.
A step of a sequence fills the state inputs the request left out from the sequence's last output state (zeros at
`sequence_start`), goes through the batcher like any request (so states of many sequences run in one batch), and
keeps the new state. Steps of one sequence run one after the other, in the order they came. A sequence is freed at
`sequence_end`, or when idle longer than `idle_s` (`expire`, called by the server now and then).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Hashable

import numpy as np

from rlopt.manifest import InputProfile, NetworkRecord, checked_file
from rlopt.serve.errors import invalid

META_STATE = "meta:state"  # reference.npz's key for the state pairs, as rlopt.reference writes it


def state_pairs(model_dir: Path, record: NetworkRecord) -> dict[str, str]:
    """The network's state pairs from its reference.npz (checked against the manifest first); {} without state."""
    import json

    with np.load(checked_file(model_dir, record.reference), allow_pickle=False) as reference:
        if META_STATE not in reference.files:
            return {}
        return dict(json.loads(str(reference[META_STATE])))


@dataclass(eq=False)
class Sequence:
    state: dict[str, np.ndarray] = field(default_factory=dict)
    last_used: float = 0.0
    in_flight: int = 0
    tail: Future[Any] | None = None


Submit = Callable[[dict[str, np.ndarray]], "Future[dict[str, np.ndarray]]"]


class SequenceStore:
    """Live sequences of one network; thread-safe."""

    def __init__(self, pairs: dict[str, str], inputs: dict[str, InputProfile], idle_s: float,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.pairs, self.inputs, self.idle_s = dict(pairs), inputs, float(idle_s)
        self._clock = clock
        self._lock = threading.Lock()
        self._live: dict[Hashable, Sequence] = {}

    def __len__(self) -> int:
        return len(self._live)

    def step(self, sequence_id: Hashable, start: bool, end: bool, feeds: dict[str, np.ndarray],
             submit: Submit) -> Future[dict[str, np.ndarray]]:
        """Run one step of a sequence through `submit` (the batcher) once its previous step is done."""
        with self._lock:
            sequence = self._live.get(sequence_id)
            if start:
                sequence = self._live[sequence_id] = Sequence(tail=sequence.tail if sequence else None)
            elif sequence is None:
                raise invalid("parameters.sequence_id", f"sequence {sequence_id!r} is not live (never started, ended, "
                              "or idle past --sequence-idle-s); fix: send its first request with sequence_start",
                              "sequence")
            result: Future[dict[str, np.ndarray]] = Future()
            previous, sequence.tail = sequence.tail, result
            sequence.in_flight += 1
            sequence.last_used = self._clock()

        def finish(outputs: dict[str, np.ndarray] | None, exc: BaseException | None) -> None:
            if outputs is not None:
                sequence.state = {name: outputs[out] for name, out in self.pairs.items()}
            with self._lock:
                sequence.in_flight -= 1
                sequence.last_used = self._clock()
                if end and self._live.get(sequence_id) is sequence:
                    del self._live[sequence_id]
            if exc is not None:
                result.set_exception(exc)
            else:
                result.set_result(outputs)  # type: ignore[arg-type]

        def go(_: object = None) -> None:
            try:
                inner = submit(self._with_state(feeds, sequence))
            except Exception as exc:  # noqa: BLE001 -- the request's own error, on its own Future
                finish(None, exc)
                return
            inner.add_done_callback(lambda done: finish(None, done.exception()) if done.exception() is not None
                                    else finish(done.result(), None))

        if previous is None or previous.done():
            go()
        else:
            previous.add_done_callback(go)
        return result

    def _with_state(self, feeds: dict[str, np.ndarray], sequence: Sequence) -> dict[str, np.ndarray]:
        """The feeds with every omitted state input filled from the sequence (zeros before its first step)."""
        rows = next((int(v.shape[0]) for n, v in feeds.items() if n not in self.pairs and np.ndim(v)), 1)
        full = dict(feeds)
        for name in self.pairs:
            if name in feeds:
                continue
            kept = sequence.state.get(name)
            if kept is not None:
                if kept.shape[0] != rows:
                    raise invalid(f"inputs.{name}", f"the sequence's state has {kept.shape[0]} rows and this request "
                                  f"{rows}; fix: keep a sequence's rows fixed, or send '{name}' yourself", "sequence")
                full[name] = kept
                continue
            profile = self.inputs[name]
            if profile.min[1:] != profile.max[1:]:
                raise invalid(f"inputs.{name}", f"state input '{name}' has dims that vary ({profile.min} to "
                              f"{profile.max}); fix: send it with the sequence's first request", "sequence")
            full[name] = np.zeros((rows, *profile.min[1:]), dtype=profile.dtype)
        return full

    def expire(self) -> int:
        """Free the sequences idle past `idle_s` with nothing in flight; how many were freed."""
        now = self._clock()
        with self._lock:
            idle = [key for key, s in self._live.items() if not s.in_flight and now - s.last_used > self.idle_s]
            for key in idle:
                del self._live[key]
        return len(idle)


__all__ = ["META_STATE", "Sequence", "SequenceStore", "state_pairs"]
