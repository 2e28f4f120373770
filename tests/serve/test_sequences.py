"""Server-side recurrent state: the store's rules on a fake submit and clock, and a served GRU whose per-sequence
state equals feeding the state by hand, over several steps, with sequences interleaved (HTTP and gRPC)."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.manifest import InputProfile
from rlopt.serve.errors import InferError
from rlopt.serve.repository import ServeOptions
from rlopt.serve.sequences import SequenceStore
from tests.serve.conftest import running

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

PROFILES = {"obs": InputProfile(dtype="float32", min=[1, 2], opt=[1, 2], max=[4, 2]),
            "h": InputProfile(dtype="float32", min=[1, 3], opt=[1, 3], max=[4, 3])}


def adder(feeds: dict[str, np.ndarray]) -> Future:
    """A fake network: h_new = h + obs[:, :1]; the Future is already done."""
    future: Future = Future()
    future.set_result({"h_new": feeds["h"] + feeds["obs"][:, :1], "h_seen": feeds["h"].copy()})
    return future


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def test_state_starts_at_zero_carries_over_resets_and_frees() -> None:
    clock = Clock()
    store = SequenceStore({"h": "h_new"}, PROFILES, idle_s=10, clock=clock)
    obs = np.ones((1, 2), np.float32)
    assert store.step(7, True, False, {"obs": obs}, adder).result()["h_seen"].tolist() == [[0, 0, 0]]
    assert store.step(7, False, False, {"obs": obs}, adder).result()["h_seen"].tolist() == [[1, 1, 1]]
    given = store.step(7, False, False, {"obs": obs, "h": np.full((1, 3), 5, np.float32)}, adder).result()
    assert given["h_seen"].tolist() == [[5, 5, 5]]  # a state the client sends wins
    assert store.step(7, True, True, {"obs": obs}, adder).result()["h_seen"].tolist() == [[0, 0, 0]]  # reset
    assert len(store) == 0  # ...and freed at its end
    with pytest.raises(InferError, match="sequence_start"):
        store.step(7, False, False, {"obs": obs}, adder)
    store.step("a", True, False, {"obs": obs}, adder).result()
    clock.now = 5.0
    assert store.expire() == 0
    clock.now = 11.0
    assert store.expire() == 1 and len(store) == 0
    store.step("b", True, False, {"obs": obs}, adder).result()
    with pytest.raises(InferError, match="rows"):
        store.step("b", False, False, {"obs": np.ones((2, 2), np.float32)}, adder).result()


def test_steps_of_one_sequence_wait_for_each_other() -> None:
    store = SequenceStore({"h": "h_new"}, PROFILES, idle_s=10)
    pending: list[tuple[Future, dict[str, np.ndarray]]] = []

    def held(feeds: dict[str, np.ndarray]) -> Future:
        future: Future = Future()
        pending.append((future, feeds))
        return future

    obs = np.ones((1, 2), np.float32)
    first = store.step(1, True, False, {"obs": obs}, held)
    second = store.step(1, False, False, {"obs": obs}, held)
    assert len(pending) == 1  # the second step waits for the first one's state
    future, feeds = pending[0]
    future.set_result({"h_new": feeds["h"] + 1})
    assert first.result(1)["h_new"].tolist() == [[1, 1, 1]]
    assert len(pending) == 2 and pending[1][1]["h"].tolist() == [[1, 1, 1]]
    pending[1][0].set_result({"h_new": pending[1][1]["h"] + 1})
    assert second.result(1)["h_new"].tolist() == [[2, 2, 2]]


def test_served_state_equals_feeding_the_state_by_hand(gru_dir: Path) -> None:
    """Four sequences (two per protocol), four steps each, sent from four threads at once so their steps are
    batched together; each sequence's logits equal a local session fed its own state step by step."""
    steps, rng = 4, np.random.default_rng(5)
    observations = rng.standard_normal((4, steps, 1, 6)).astype(np.float32)
    expected = []
    with rlopt.load(gru_dir, "actor") as session:
        for sequence in observations:
            h, logits = np.zeros((1, 16), np.float32), []
            for obs in sequence:
                out = session.run({"obs": obs, "h": h})
                logits.append(out["logits"])
                h = out["h_new"]
            expected.append(logits)
    got: dict[int, list[np.ndarray]] = {}
    with running(gru_dir, ServeOptions(max_batch=8, max_wait_us=2000)) as server:
        barrier = threading.Barrier(4)

        def actor(index: int) -> None:
            module = httpclient if index % 2 else grpcclient
            port = server.http_port if index % 2 else server.grpc_port
            client = module.InferenceServerClient(f"127.0.0.1:{port}")
            barrier.wait()
            answers = []
            for step, obs in enumerate(observations[index]):
                tensor = module.InferInput("obs", [1, 6], "FP32")
                tensor.set_data_from_numpy(obs)
                result = client.infer("actor", [tensor], sequence_id=100 + index, sequence_start=step == 0,
                                      sequence_end=step == steps - 1)
                answers.append(result.as_numpy("logits"))
            got[index] = answers

        threads = [threading.Thread(target=actor, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert len(server.repository.networks["actor"].sequences) == 0  # type: ignore[arg-type,union-attr]
    for index in range(4):
        assert len(got[index]) == steps
        for answer, reference in zip(got[index], expected[index]):
            np.testing.assert_allclose(answer, reference, rtol=1e-3, atol=1e-5)
    assert np.abs(expected[0][-1] - expected[0][0]).max() > 1e-4, "the state changes the answers"


def test_without_sequence_id_the_state_is_an_ordinary_input(gru_dir: Path) -> None:
    obs, h = np.ones((2, 6), np.float32), np.full((2, 16), 0.5, np.float32)
    with rlopt.load(gru_dir, "actor") as session:
        expected = session.run({"obs": obs, "h": h})["h_new"]
    with running(gru_dir) as server:
        client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
        tensors = []
        for name, value in (("obs", obs), ("h", h)):
            tensors.append(httpclient.InferInput(name, list(value.shape), "FP32"))
            tensors[-1].set_data_from_numpy(value)
        np.testing.assert_allclose(client.infer("actor", tensors).as_numpy("h_new"), expected, rtol=1e-3, atol=1e-5)
        with pytest.raises(Exception, match="no input 'h'"):
            client.infer("actor", tensors[:1])
        with pytest.raises(Exception, match="not live"):
            client.infer("actor", tensors[:1], sequence_id=9)
