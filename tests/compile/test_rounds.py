"""Interleaved rounds of timed blocks, in this process and with each subject in a worker process of its own (`auto`'s
measurement)."""

from __future__ import annotations

from pathlib import Path

import pytest

import os

from rlopt.compile import apart
from rlopt.compile.auto import named_shapes
from rlopt.compile.apart import _Workers, apart_rounds, kept_workers, release_apart
from rlopt.compile.route_passes import AA, Measurement
from rlopt.compile.rounds import configuration_rounds, drive_rounds
from rlopt.manifest import read_manifest
from rlopt.tools.bench.candidates import load_reference


class FakeClock:
    """`time` for rlopt.compile.rounds: a call costs what the test says, sleeping advances the clock; no wall clock."""

    def __init__(self) -> None:
        self.ns = 0

    def perf_counter_ns(self) -> int:
        return self.ns

    def thread_time_ns(self) -> int:
        return self.ns  # a call computes on the calling thread for all it costs

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


def test_configuration_rounds_time_every_cell_of_every_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.compile import rounds as rounds_module

    clock = FakeClock()
    monkeypatch.setattr(rounds_module, "time", clock)
    configurations = {"alone a": {("a", "s"): clock.costing(900, 900, 200)},  # the first calls are not its speed
                      "together": {("a", "s"): clock.costing(200), ("b", "s"): clock.costing(1000)}}
    result = drive_rounds(configuration_rounds(configurations), rounds=3)
    assert result.done == 3
    medians = result.medians()
    assert medians == {"alone a": {("a", "s"): 200.0}, "together": {("a", "s"): 200.0, ("b", "s"): 1000.0}}
    assert result.medians(cpu=True) == medians, \
        "the calling thread's CPU time per call, where the call is all it spends"
    slow = {"c": {("a", "s"): clock.costing(20_000)}}
    result = drive_rounds(configuration_rounds(slow, estimates_us={"a": {"s": 20_000.0}}), rounds=5, budget_s=0.01)
    assert result.done == 1, "no round starts once the budget is spent, but one always runs"


def _state(pid: int) -> str:
    """The process state letter from /proc (T: stopped; t: stopped while traced, as under strace)."""
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]


def _stopped(pid: int) -> bool:
    """Stopped, or about to be: SIGSTOP is delivered when the process is next scheduled (up to 1 s here)."""
    import time

    for _ in range(100):
        if _state(pid) in ("T", "t"):
            return True
        time.sleep(0.01)
    return False


def test_each_onnx_runtime_configuration_is_timed_in_a_process_of_its_own(tiny_compiled: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    labels = named_shapes(record, load_reference(tiny_compiled, record)) | {"other": "opt"}
    facts = record.artifacts["onnxruntime"].facts.as_dict()
    subjects = {"onnxruntime": ("onnxruntime", facts),
                "onnxruntime 1 thread": ("onnxruntime", {**facts, "intra_op_threads": 1}),
                "onnxruntime (A/A)": ("onnxruntime", facts)}
    with kept_workers():
        result = apart_rounds(tiny_compiled, record, subjects, labels, rounds=3)
        alone, cpu, rounds = result.medians(), result.medians(cpu=True), result.done
        pids = [p.popen.pid for p in _Workers.processes]
        assert len(set(pids)) == 3 and os.getpid() not in pids, "one worker per subject"
        assert all(_stopped(pid) for pid in pids), "frozen between their requests"
    assert rounds == 3 and set(alone) == set(cpu) == set(subjects)
    assert all(set(table) == set(labels) and 0 < min(table.values()) < 1e6 for table in alone.values())
    assert all(0 < min(table.values()) < 1e6 for table in cpu.values())
    assert _Workers.processes == [] and not any(Path(f"/proc/{pid}").exists() for pid in pids), "gone after"


def test_a_backend_timed_apart_is_measured_in_workers_unless_the_suite_turns_them_off(
        tiny_compiled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    labels = named_shapes(record, load_reference(tiny_compiled, record))
    monkeypatch.setattr(apart, "ENABLED", True)
    shipped = Measurement(None, record, ["onnxruntime", "torchscript"], labels)  # type: ignore[arg-type]
    assert set(shipped.fresh) == {"onnxruntime", "onnxruntime" + AA} and "onnxruntime" not in shipped.here
    monkeypatch.setattr(apart, "ENABLED", False)
    suite = Measurement(None, record, ["onnxruntime", "torchscript"], labels)  # type: ignore[arg-type]
    assert suite.fresh == {} and {"onnxruntime", "torchscript"} <= set(suite.here)


def test_a_worker_keeps_its_subject_for_the_next_pass_until_released(tiny_compiled: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    labels = named_shapes(record, load_reference(tiny_compiled, record))
    subjects = {"onnxruntime": ("onnxruntime", record.artifacts["onnxruntime"].facts.as_dict())}
    with kept_workers():
        first = apart_rounds(tiny_compiled, record, subjects, labels, rounds=2, keep=True)
        worker = _Workers.processes[0]
        second = apart_rounds(tiny_compiled, record, subjects, labels, rounds=2, keep=True)
        release_apart()
        assert _Workers.processes == [worker] and worker.alive(), "the worker lives on"
    assert first.done == second.done == 2 and set(first.medians()) == set(second.medians()) == {"onnxruntime"}
    assert _Workers.processes == [] and not worker.alive(), "and exits with the last kept_workers"


def test_a_fresh_process_that_fails_says_why_in_one_line(tiny_compiled: Path, tmp_path: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    labels = named_shapes(record, load_reference(tiny_compiled, record))
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "reference.npz").write_bytes((tiny_compiled / record.reference.path).read_bytes())
    with pytest.raises(RuntimeError) as raised:  # the artifact is not in tmp_path
        apart_rounds(tmp_path, record, {"onnxruntime": ("onnxruntime", {})}, labels)
    message = str(raised.value)
    assert message.startswith("timing onnxruntime in a fresh process failed: ") and "\n" not in message


def test_a_frozen_worker_dies_with_the_process_that_started_it() -> None:
    """A compile killed mid-measurement leaves no frozen worker behind (PR_SET_PDEATHSIG)."""
    import signal
    import subprocess
    import sys
    import time

    code = ("import signal, time\nfrom rlopt.compile.apart import _Process\np = _Process()\n"
            "assert p.ask({'release': True}) == {'released': True}\nprint(p.popen.pid, flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        worker = int(parent.stdout.readline())
        assert _stopped(worker), "frozen after its answer"
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    for _ in range(200):
        if not Path(f"/proc/{worker}").exists() or _state(worker) == "Z":
            break
        time.sleep(0.05)
    else:
        raise AssertionError(f"worker {worker} outlived its parent ({_state(worker)})")


def test_rounds_visit_every_subject_take_the_minimum_and_keep_every_call(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.compile import rounds as rounds_module
    from rlopt.compile.rounds import Block, drive_rounds

    clock = FakeClock()
    monkeypatch.setattr(rounds_module, "time", clock)
    visits: list[str] = []
    slow = iter([[100.0, 900.0, 100.0]] + [[100.0, 100.0, 100.0]] * 100)  # one slow call: in p99, not in p50

    def of(key: str, calls: object) -> object:
        def blocks() -> dict[str, Block]:
            visits.append(key)
            clock.sleep(0.01)
            walls = next(calls) if not isinstance(calls, list) else calls  # type: ignore[call-overload]
            return {"opt": Block(float(sorted(walls)[len(walls) // 2]), 1.0, list(walls))}
        return blocks

    result = drive_rounds({"a": of("a", slow), "b": of("b", [3000.0])}, rounds=15, budget_s=0.0,  # type: ignore
                          min_rounds=5)
    assert result.done == 5 and sorted(visits) == ["a"] * 5 + ["b"] * 5, "the minimum rounds, spent budget or not"
    assert visits[:2] != visits[2:4] or visits[4:6] != visits[6:8], "each round in shuffled order"
    assert result.medians() == {"a": {"opt": 100.0}, "b": {"opt": 3000.0}}
    assert result.p99()["a"]["opt"] > 100.0 and len(result.calls["a"]["opt"]) == 15
    capped = drive_rounds({"a": of("a", [1.0])}, rounds=3, budget_s=100.0, min_rounds=1)  # type: ignore[dict-item]
    assert capped.done == 3, "never more than `rounds`"


def test_each_backend_is_timed_in_a_worker_of_its_own_for_the_manifest(tiny_compiled: Path) -> None:
    from rlopt.compile.rounds import Block

    record = read_manifest(tiny_compiled).networks["policy"]
    labels = {"min": "min", "opt": "opt", "max": "max"}
    subjects = {b: (b, record.artifacts[b].facts.as_dict()) for b in ("onnxruntime", "torchscript")}
    visits: list[int] = []

    def here() -> dict[str, Block]:  # a subject timed in this process, in the same rounds as the workers'
        visits.append(len(visits))
        return {"opt": Block(7.0, 7.0, [7.0])}

    with kept_workers():
        rounds = apart_rounds(tiny_compiled, record, subjects, labels, budget_s=0.0, rounds=15, min_rounds=5,
                              alongside={"alone here": here})
        pids = [p.popen.pid for p in _Workers.processes]
        assert len(set(pids)) == 2 and os.getpid() not in pids and all(_stopped(pid) for pid in pids)
    assert rounds.done == 5 and len(visits) == 5 and rounds.medians()["alone here"] == {"opt": 7.0}
    p50, p99 = rounds.medians(), rounds.p99()
    assert set(p50) == {*subjects, "alone here"} and all(set(p50[b]) == set(labels) for b in subjects)
    assert all(0 < p50[b][p] <= p99[b][p] < 1e6 and len(rounds.calls[b][p]) >= 5 for b in subjects for p in labels)
    assert _Workers.processes == [], "gone with the compile"


def test_the_latency_stage_times_in_process_with_a_notice_when_a_worker_fails(
        tiny_compiled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from types import SimpleNamespace

    from rlopt.compile import latency

    record = read_manifest(tiny_compiled).networks["policy"]
    ctx = SimpleNamespace(staging=tiny_compiled, reference=load_reference(tiny_compiled, record))

    def fails(*args: object, **kwargs: object) -> None:
        raise RuntimeError("timing onnxruntime in a fresh process failed: it exited or did not answer")

    monkeypatch.setattr(apart, "ENABLED", True)
    monkeypatch.setattr(latency, "apart_rounds", fails)
    out = latency.TimeBackends(record).run(ctx)  # type: ignore[arg-type]
    assert out.facts["notice"].startswith("latency timed in the compiling process, not in a worker: timing onnx")
    timed = latency.timed_backends(record)
    assert set(out.facts["latency_us"]) == set(timed) and "onnxruntime" in timed
    assert all(set(points) == set(ctx.reference.points) for points in out.facts["latency_us"].values())
    copy = record.model_copy(deep=True)
    latency.apply_latencies(copy, out)
    assert "not in a worker" in (copy.artifacts["onnxruntime"].facts.notice or "")
    assert copy.artifacts["onnxruntime"].latency_us["opt"].iterations >= latency.MIN_ROUNDS
