"""Interleaved rounds of timed blocks, in this process and with each subject in a worker process of its own (`auto`'s
measurement)."""

from __future__ import annotations

from pathlib import Path

import pytest

import os

from rlopt.compile import apart
from rlopt.compile.auto import named_shapes
from rlopt.compile.apart import _Workers, apart_medians, kept_workers, release_apart
from rlopt.compile.route_passes import AA, Measurement
from rlopt.compile.rounds import interleaved_medians
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


def test_interleaved_medians_time_every_cell_of_every_configuration(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.compile import rounds as rounds_module

    clock = FakeClock()
    monkeypatch.setattr(rounds_module, "time", clock)
    configurations = {"alone a": {("a", "s"): clock.costing(900, 900, 200)},  # the first calls are not its speed
                      "together": {("a", "s"): clock.costing(200), ("b", "s"): clock.costing(1000)}}
    medians, cpu, rounds = interleaved_medians(configurations, rounds=3)
    assert rounds == 3
    assert medians == {"alone a": {("a", "s"): 200.0}, "together": {("a", "s"): 200.0, ("b", "s"): 1000.0}}
    assert cpu == medians, "the calling thread's CPU time per call, where the call is all it spends"
    slow = {"c": {("a", "s"): clock.costing(20_000)}}
    _, _, rounds = interleaved_medians(slow, rounds=5, estimates_us={"a": {"s": 20_000.0}}, budget_s=0.01)
    assert rounds == 1, "no round starts once the budget is spent, but one always runs"


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
        alone, cpu, rounds = apart_medians(tiny_compiled, record, subjects, labels, rounds=3)
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
        first = apart_medians(tiny_compiled, record, subjects, labels, rounds=2, keep=True)
        worker = _Workers.processes[0]
        second = apart_medians(tiny_compiled, record, subjects, labels, rounds=2, keep=True)
        release_apart()
        assert _Workers.processes == [worker] and worker.alive(), "the worker lives on"
    assert first[2] == second[2] == 2 and set(first[0]) == set(second[0]) == {"onnxruntime"}
    assert _Workers.processes == [] and not worker.alive(), "and exits with the last kept_workers"


def test_a_fresh_process_that_fails_says_why_in_one_line(tiny_compiled: Path, tmp_path: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    labels = named_shapes(record, load_reference(tiny_compiled, record))
    (tmp_path / "policy").mkdir()
    (tmp_path / "policy" / "reference.npz").write_bytes((tiny_compiled / record.reference.path).read_bytes())
    with pytest.raises(RuntimeError) as raised:  # the artifact is not in tmp_path
        apart_medians(tmp_path, record, {"onnxruntime": ("onnxruntime", {})}, labels)
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


def test_point_latencies_report_the_median_of_block_medians_and_take_the_minimum_rounds(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.compile import rounds as rounds_module

    clock = FakeClock()
    monkeypatch.setattr(rounds_module, "time", clock)
    monkeypatch.setattr(rounds_module, "warm_until_steady", lambda call, **_: 0)
    spikes = iter([100.0, 100.0, 900.0] + [100.0] * 1000)  # estimate, untimed, then one slow timed call
    calls = {"min": lambda: setattr(clock, "ns", clock.ns + int(next(spikes) * 1e3)),
             "max": clock.costing(3000)}
    stats = rounds_module.point_latencies(calls, budget_s=0.0, min_rounds=5)
    assert set(stats) == {"min", "max"}
    assert stats["min"].p50_us == 100.0 and stats["max"].p50_us == 3000.0
    assert stats["min"].p99_us > 100.0, "the slow call is in the p99"
    # a block is BURST_CALLS cheap calls, or one call where that many would take over CELL_BUDGET_S
    assert stats["min"].iterations == 5 * rounds_module.BURST_CALLS and stats["max"].iterations == 5


def test_verify_latencies_are_timed_in_a_worker_of_their_own(tiny_compiled: Path) -> None:
    from rlopt.compile.apart import apart_latencies

    record = read_manifest(tiny_compiled).networks["policy"]
    artifact = record.artifacts["onnxruntime"]
    assert artifact.path is not None and record.reference is not None
    with kept_workers():
        stats = apart_latencies("onnxruntime", tiny_compiled / artifact.path, artifact.facts.as_dict(),
                                tiny_compiled / record.reference.path, list(record.inputs), list(record.outputs),
                                ["min", "opt", "max"], budget_s=0.05)
        worker = _Workers.named["onnxruntime"]
        assert worker.popen.pid != os.getpid() and _stopped(worker.popen.pid), "frozen between its requests"
    assert set(stats) == {"min", "opt", "max"}
    assert all(0 < s.p50_us <= s.p99_us < 1e6 and s.iterations >= 5 for s in stats.values())
    assert _Workers.named == {} and not worker.alive(), "gone with the compile"


def test_a_latency_worker_that_cannot_open_the_artifact_says_why_in_one_line(tiny_compiled: Path,
                                                                            tmp_path: Path) -> None:
    from rlopt.compile.apart import apart_latencies

    record = read_manifest(tiny_compiled).networks["policy"]
    assert record.reference is not None
    (tmp_path / "model.onnx").write_bytes(b"not onnx")
    with pytest.raises(RuntimeError) as raised:
        apart_latencies("onnxruntime", tmp_path / "model.onnx", {}, tiny_compiled / record.reference.path,
                        list(record.inputs), list(record.outputs), ["opt"], budget_s=0.05)
    assert str(raised.value).startswith("timing onnxruntime in a fresh process failed: ")
    assert "\n" not in str(raised.value)
