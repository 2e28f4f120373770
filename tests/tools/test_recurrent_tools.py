"""Recurrent state in the tools (contract section 8): warmup and bench keep one state per simulated actor, fed
back from the network's own output state; `Session.inputs` describes every input, integer ranges included.

The network is a tiny GRUCell policy behind an embedding of integer ids, built for ONNX Runtime only (model.ts
is written anyway, for the bench worker's TorchScript candidate).
"""

from __future__ import annotations

import threading
from multiprocessing import Pipe
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlopt
from rlopt.manifest import InputProfile, read_manifest
from rlopt.tools.bench.candidates import OPENERS, CandidateSpec, OpenCandidate, load_reference
from rlopt.tools.bench.worker import _serve
from rlopt.tools.warmup import run_warmup
from tests.conftest import CompileFactory
from tests.tools.common import write_profile

MODEL = """\
import torch
from torch import nn


class GruIdsActor(nn.Module):
    def __init__(self, vocab: int = 5, d: int = 8, hidden: int = 16, n_actions: int = 3) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.cell = nn.GRUCell(d, hidden)
        self.head = nn.Linear(hidden, n_actions)

    def forward(self, ids: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h_new = self.cell(self.embed(ids), h)
        return self.head(h_new), h_new
"""

RECIPE = """\
name: gru-ids
model: {factory: models/gru_ids.py:GruIdsActor, seed: 1}
networks:
  actor:
    module: ""
    kind: policy
    inputs:
      ids: {dtype: int64, range: [0, 4], min: [1], opt: [2], max: [4]}
      h: {dtype: float32, min: [1, 16], opt: [2, 16], max: [4, 16]}
    outputs: [logits, h_new]
    state: {h: h_new}
backends: [onnxruntime]
verify: {samples: 2, steps: 2}
"""


@pytest.fixture(scope="module")
def gru_dir(compiled: CompileFactory) -> Path:
    return compiled(RECIPE, name="gru.yaml", files={"models/gru_ids.py": MODEL})


def test_session_inputs_give_dtype_profile_and_integer_range(gru_dir: Path) -> None:
    with rlopt.load(gru_dir, "actor", "onnxruntime") as session:
        assert session.inputs == {
            "ids": InputProfile(dtype="int64", min=[1], opt=[2], max=[4], range=[0, 4], index_range=[0, 4]),
            "h": InputProfile(dtype="float32", min=[1, 16], opt=[2, 16], max=[4, 16], range=None)}
        assert session.outputs == ["logits", "h_new"]


class RecordingSession:
    """Wraps a real Session: per thread, the `h` each call was given and the `h_new` it returned."""

    def __init__(self, session: Any) -> None:
        self.session, self.backend = session, session.backend
        self.calls: dict[int, list[tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        h = feeds["h"].copy()
        outputs = self.session.run(feeds)
        self.calls.setdefault(threading.get_ident(), []).append((feeds["h"], h, outputs["h_new"].copy()))
        return outputs

    def close(self) -> None:
        self.session.close()


def test_warmup_feeds_each_actors_state_back(gru_dir: Path, tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Batch 3 is no reference point (probes run at 1, 2 and 4), so every batch-3 call is a load request."""
    sessions: list[RecordingSession] = []
    real_load = rlopt.load

    def load(*args: Any) -> RecordingSession:
        sessions.append(RecordingSession(real_load(*args)))
        return sessions[-1]

    monkeypatch.setattr(rlopt, "load", load)
    profile = write_profile(tmp_path, {"network": "actor", "duration_s": 0.5, "concurrency": 2, "requests": [
        {"weight": 0.5, "shapes": {"ids": [3], "h": [3, 16]}}, {"weight": 0.5, "shapes": {"ids": [2], "h": [2, 16]}}]})
    result = run_warmup(gru_dir, profile, backend="onnxruntime", write_files=False)
    assert result.report.consistency.passed and not result.report.failures, result.report.failures
    [recording] = sessions
    actors = [[c for c in calls if c[1].shape == (3, 16)] for calls in recording.calls.values()]
    actors = [calls for calls in actors if len(calls) > 10]
    assert len(actors) == 2, "both load threads ran batch-3 requests"
    for calls in actors:
        _, first_h, _ = calls[0]
        assert not first_h.any(), "an actor starts from a zero state"
        for (_, _, h_new), (_, h_next, _) in zip(calls, calls[1:]):
            np.testing.assert_array_equal(h_next, h_new)  # the output state is the next call's input state
        assert np.abs(calls[-1][2] - calls[0][2]).max() > 1e-3, "the state evolves"
    assert actors[0][0][0] is not actors[1][0][0], "each thread keeps its own state"


def recording(opened: OpenCandidate, log: list[tuple[np.ndarray, object]]) -> OpenCandidate:
    """The candidate's calls, logging the `h` each was given (copied before the call) and what it returned."""

    def prepare(feeds: dict[str, np.ndarray]) -> Any:
        inner = opened.prepare(feeds)

        def call() -> object:
            h = feeds["h"].copy()
            result = inner()
            log.append((h, result))
            return result

        return call

    return OpenCandidate(prepare, opened.close)


def h_new_of(result: object) -> np.ndarray:
    """`h_new` from what a candidate returns: a dict (rlopt), a list (ONNX Runtime), a tuple of tensors (torch)."""
    if isinstance(result, dict):
        return np.asarray(result["h_new"])
    value = list(result)[1]  # type: ignore[call-overload]
    return np.asarray(value.detach() if hasattr(value, "detach") else value)


@pytest.mark.parametrize("kind", ["rlopt", "onnx session", "torchscript module"])
def test_bench_worker_feeds_state_back_between_calls(gru_dir: Path, kind: str) -> None:
    """The worker's request loop in this process: warm at opt, two timed blocks; every call after the first gets
    the previous call's output state."""
    record = read_manifest(gru_dir).networks["actor"]
    spec = CandidateSpec(kind, "test", "", kind, str(gru_dir), "actor", backend="onnxruntime", threads=1)
    log: list[tuple[np.ndarray, object]] = []
    opened = recording(OPENERS[kind](spec), log)
    parent, child = Pipe()
    for request in [("shape", "opt", False), ("block", 3), ("block", 3), ("exit",)]:
        parent.send(request)
    try:
        _serve(child, opened, load_reference(gru_dir, record), list(record.inputs), record.outputs)
    finally:
        opened.close()
    replies = [parent.recv() for _ in range(3)]
    assert [r[0] for r in replies] == ["warm", "block", "block"], replies
    reference = load_reference(gru_dir, record)
    np.testing.assert_array_equal(log[0][0], reference.feeds("opt", 0)["h"])  # the recorded state to start from
    assert len(log) == 5 + 2 * 4
    for (_, result), (h_next, _) in zip(log, log[1:]):
        np.testing.assert_allclose(h_next, h_new_of(result), rtol=0, atol=0)
    assert np.abs(h_new_of(log[-1][1]) - log[0][0]).max() > 1e-3
