"""Interleaved rounds of timed blocks, in this process and in a fresh one (`auto`'s measurement)."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlopt.compile.auto import named_shapes
from rlopt.compile.rounds import fresh_process_medians, interleaved_medians
from rlopt.manifest import read_manifest
from rlopt.tools.bench.candidates import load_reference


class FakeClock:
    """`time` for rlopt.compile.rounds: a call costs what the test says, sleeping advances the clock; no wall clock."""

    def __init__(self) -> None:
        self.ns = 0

    def perf_counter_ns(self) -> int:
        return self.ns

    def monotonic(self) -> float:
        return self.ns / 1e9

    def sleep(self, seconds: float) -> None:
        self.ns += int(seconds * 1e9)

    def costing(self, *us: float):
        """A call costing us[0], then us[1], ... (the last one from then on)."""
        costs = list(us)

        def call() -> None:
            self.ns += int((costs.pop(0) if len(costs) > 1 else costs[0]) * 1e3)
        return call


def test_interleaved_medians_time_every_cell_of_every_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.compile import rounds as rounds_module

    clock = FakeClock()
    monkeypatch.setattr(rounds_module, "time", clock)
    configurations = {"alone a": {("a", "s"): clock.costing(900, 900, 200)},  # the first calls are not its speed
                      "together": {("a", "s"): clock.costing(200), ("b", "s"): clock.costing(1000)}}
    medians, rounds = interleaved_medians(configurations, rounds=3)
    assert rounds == 3
    assert medians == {"alone a": {("a", "s"): 200.0}, "together": {("a", "s"): 200.0, ("b", "s"): 1000.0}}
    slow = {"c": {("a", "s"): clock.costing(20_000)}}
    _, rounds = interleaved_medians(slow, rounds=5, estimates_us={"a": {"s": 20_000.0}}, budget_s=0.01)
    assert rounds == 1, "no round starts once the budget is spent, but one always runs"


def test_onnx_runtime_alone_is_timed_in_a_fresh_process(tiny_compiled: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    labels = named_shapes(record, load_reference(tiny_compiled, record)) | {"other": "opt"}
    facts = record.artifacts["onnxruntime"].facts.as_dict()
    subjects = {"onnxruntime": ("onnxruntime", facts),
                "onnxruntime 1 thread": ("onnxruntime", {**facts, "intra_op_threads": 1})}
    alone, rounds = fresh_process_medians(tiny_compiled, record, subjects, labels)
    assert rounds >= 1 and set(alone) == set(subjects)
    assert all(set(table) == set(labels) and 0 < min(table.values()) < 1e6 for table in alone.values())


def test_a_fresh_process_that_fails_says_why_in_one_line(tiny_compiled: Path, tmp_path: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    labels = named_shapes(record, load_reference(tiny_compiled, record))
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "reference.npz").write_bytes((tiny_compiled / record.reference.path).read_bytes())
    with pytest.raises(RuntimeError) as raised:  # the artifact is not in tmp_path
        fresh_process_medians(tmp_path, record, {"onnxruntime": ("onnxruntime", {})}, labels)
    message = str(raised.value)
    assert message.startswith("timing onnxruntime in a fresh process failed: ") and "\n" not in message
