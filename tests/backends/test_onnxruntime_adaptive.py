"""`auto`'s ONNX Runtime threads chosen while serving: each thread times one thread against the pool now and then."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlopt.backends.onnxruntime.adaptive import (FIRST_INTERVAL, LOOK_SHARE, MARGIN, PROBE_CALLS, WARM_NS,
                                                 ThreadChoice)
from tests.test_onnx_session import _model_bytes


class _Machine:
    """Fake sessions whose calls take a set number of ns on a fake clock; each returns its own name."""

    def __init__(self, latency_ns: dict[str, int]) -> None:
        self.latency_ns, self.now, self.calls = latency_ns, 0, {name: 0 for name in latency_ns}

    def run(self, name: str) -> Any:
        def call(fetched: list[str], feeds: dict[str, Any], options: Any) -> list[str]:
            self.now += self.latency_ns[name]
            self.calls[name] += 1
            return [name]
        return call

    def choice(self, current: str, events: list[dict[str, Any]]) -> ThreadChoice:
        return ThreadChoice({n: self.run(n) for n in self.latency_ns}, current, "256x4", events.append,
                            clock=lambda: self.now)


def test_a_look_warms_the_other_session_moves_to_the_faster_and_looks_again_soon() -> None:
    machine, events = _Machine({"default pool": 74_000, "1 thread": 62_000}), []
    choice = machine.choice("default pool", events)
    assert choice.left == 0, "the first call looks"
    assert choice.look([], {}) == ["1 thread"] and choice.current == "1 thread"
    assert choice.run([], {}, None) == ["1 thread"]
    warm_calls = -(-WARM_NS // 62_000)  # untimed calls until WARM_NS has passed on the session not serving
    assert machine.calls == {"default pool": 1 + PROBE_CALLS, "1 thread": warm_calls + PROBE_CALLS + 1}
    look_ns = (1 + PROBE_CALLS) * 74_000 + (warm_calls + PROBE_CALLS) * 62_000
    assert choice.left == max(FIRST_INTERVAL, LOOK_SHARE * look_ns // 62_000), "looks take 1/LOOK_SHARE of the time"
    assert events == [{"event": "onnxruntime switched to 1 thread", "from": "default pool", "shape": "256x4",
                       "default pool_us": 74.0, "1 thread_us": 62.0, "thread": "MainThread"}]


def test_a_session_within_the_margin_keeps_serving_and_looks_less_often() -> None:
    slower = int(60_000 * (1 - MARGIN / 2))
    machine, events = _Machine({"1 thread": 60_000, "default pool": slower}), []
    choice = machine.choice("1 thread", events)
    choice.look([], {})
    first = choice.left
    choice.look([], {})
    assert choice.current == "1 thread" and events == [] and choice.interval == 4 * FIRST_INTERVAL
    assert choice.left >= first
    machine.latency_ns["1 thread"] = 90_000  # the machine changed: the pool is now clearly faster
    choice.look([], {})
    assert choice.current == "default pool" and choice.interval == FIRST_INTERVAL and len(events) == 1


pytest.importorskip("onnxruntime")


def _runner(tmp_path: Path, **facts: Any):  # type: ignore[no-untyped-def]
    from rlopt.backends.onnxruntime.runner import OnnxRuntimeRunner

    path = tmp_path / "relu.onnx"
    path.write_bytes(_model_bytes())
    return OnnxRuntimeRunner(path, ["x"], {"providers": ["CPUExecutionProvider"], **facts})


@pytest.fixture
def two_cores(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rlopt.backends.onnxruntime.runner.usable_cores", lambda: 2)
    monkeypatch.setenv("RLOPT_ORT_ADAPTIVE", "1")


@pytest.mark.usefixtures("two_cores")
def test_an_adaptive_runner_opens_both_sessions_and_serves_the_same_answers(tmp_path: Path) -> None:
    runner = _runner(tmp_path, adaptive_threads=True, intra_op_threads=1)
    sessions = runner._sessions
    assert list(sessions) == ["1 thread", "default pool"], "the recorded choice serves first"
    assert sessions["1 thread"].get_session_options().intra_op_num_threads == 1
    assert sessions["default pool"].get_session_options().intra_op_num_threads == 0
    x = np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.0]], dtype=np.float32)
    call = runner.bound_call((((2, 3), np.dtype(np.float32)),), ["action"])
    assert call is not None
    for _ in range(3 * FIRST_INTERVAL):  # through several looks
        assert np.array_equal(call({"x": x}, (x,))["action"], np.maximum(x, 0))
    assert all(event["shape"] == "2x3" for event in runner.events())


@pytest.mark.usefixtures("two_cores")
def test_one_session_when_turned_off_too_large_on_one_core_or_with_other_threads(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert not _runner(tmp_path)._sessions, "only auto asks for it"
    assert not _runner(tmp_path, adaptive_threads=True, intra_op_threads=3)._sessions
    for off in ("0", ""):
        monkeypatch.setenv("RLOPT_ORT_ADAPTIVE", off)
        assert not _runner(tmp_path, adaptive_threads=True)._sessions, "opt-in"
    monkeypatch.setenv("RLOPT_ORT_ADAPTIVE", "1")
    monkeypatch.setattr("rlopt.backends.onnxruntime.runner.SECOND_SESSION_MAX_BYTES", len(_model_bytes()) - 1)
    assert not _runner(tmp_path, adaptive_threads=True)._sessions, "a graph too large to hold twice"
    monkeypatch.undo()
    monkeypatch.setattr("rlopt.backends.onnxruntime.runner.usable_cores", lambda: 1)
    assert not _runner(tmp_path, adaptive_threads=True)._sessions
