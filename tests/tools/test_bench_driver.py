"""rlopt.tools.bench.driver and .worker: interleaved rounds, worker processes, a crash, Ctrl-C, a killed parent.

Never a wall-clock threshold.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from rlopt.errors import BackendUnavailable
from rlopt.tools.bench import (
    BLOCK_CALLS,
    WARMUP_CALLS,
    CandidateFailed,
    CandidateSpec,
    OpenCandidate,
    run_bench,
    time_interleaved,
)
from tests.tools.common import (
    CORES,
    ORT_BASELINES,
    children_of,
    needs_proc,
    process_alive,
    process_state,
    runnable_backends,
)


class FakeRunner:
    """A BlockRunner that logs its blocks; `fail_warm` / `fail_block_at` make it raise there."""

    def __init__(self, name: str, log: list[str], fail_warm: Exception | None = None,
                 fail_block_at: int | None = None) -> None:
        self.name, self.log, self.fail_warm, self.fail_block_at, self.blocks = name, log, fail_warm, fail_block_at, 0

    def warm(self) -> float:
        if self.fail_warm is not None:
            raise self.fail_warm
        return 1.5

    def block(self, timed: int) -> np.ndarray:
        self.blocks += 1
        if self.blocks == self.fail_block_at:
            raise CandidateFailed("worker exited with code 3")
        self.log.append(self.name)
        return np.full(timed, 7, dtype=np.int64)


def test_rounds_shuffle_blocks_and_drop_failing_candidates() -> None:
    log: list[str] = []
    runners = {"a": FakeRunner("a", log), "b": FakeRunner("b", log), "c": FakeRunner("c", log),
               "broken": FakeRunner("broken", log, fail_warm=RuntimeError("no C++ compiler\nmore detail"))}
    samples, first_ms, failures = time_interleaved(runners, budget_s=0.0, min_rounds=3, max_rounds=3)
    assert failures == {"broken": "RuntimeError: no C++ compiler"}
    assert set(samples) == set(first_ms) == {"a", "b", "c"} and first_ms["a"] == 1.5
    assert all(s.size == 3 * (BLOCK_CALLS - 1) and (s == 7).all() for s in samples.values())
    rounds = [log[i:i + 3] for i in range(0, 9, 3)]
    assert all(sorted(r) == ["a", "b", "c"] for r in rounds), "every live runner once per round"
    predecessors = {(x, y) for r in rounds for x, y in itertools.pairwise(r)}
    assert len(predecessors) > 2, "no runner always follows the same one"
    again: list[str] = []
    time_interleaved({n: FakeRunner(n, again) for n in "abc"}, budget_s=0.0, min_rounds=3, max_rounds=3)
    assert again == log, "the order is seeded: runs are repeatable"
    other: list[str] = []
    time_interleaved({n: FakeRunner(n, other) for n in "abc"}, budget_s=0.0, min_rounds=3, max_rounds=3, seed=[7, 0])
    assert sorted(other) == sorted(log) and other != log, "another seed, another order: runs are independent"


def test_a_runner_that_dies_mid_rounds_is_dropped_and_the_others_go_on() -> None:
    log: list[str] = []
    runners = {"a": FakeRunner("a", log), "dies": FakeRunner("dies", log, fail_block_at=2), "c": FakeRunner("c", log)}
    samples, first_ms, failures = time_interleaved(runners, budget_s=0.0, min_rounds=4, max_rounds=4)
    assert failures == {"dies": "worker exited with code 3"}  # a CandidateFailed's message is the reason as is
    assert set(samples) == set(first_ms) == {"a", "c"}
    assert log.count("dies") == 1 and log.count("a") == log.count("c") == 4
    assert samples["a"].size == 4 * (BLOCK_CALLS - 1)



# ----------------------------------------------------------------------------------------------------------------
# Worker processes: isolation, a crashing or failing candidate, cleanup. The factories below run in the workers.

TINY_OPT, TINY_MAX = (2, 3, 32), (4, 6, 32)  # conftest's tiny recipe
ORT_ONLY_WORKERS = 4 + (CORES > 1)  # rlopt onnxruntime and auto, the TorchScript module, ONNX Runtime per thread count


def crash_in_first_block_at_opt(spec: CandidateSpec) -> OpenCandidate:
    """Runs at min; at opt its process dies (exit code 3) on the first call after the warmup."""

    def prepare(feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        calls = itertools.count(1)
        at_opt = feeds["input0"].shape == TINY_OPT

        def call() -> None:
            if at_opt and next(calls) > WARMUP_CALLS:
                os._exit(3)

        return call

    return OpenCandidate(prepare)


def raise_at_max(spec: CandidateSpec) -> OpenCandidate:
    def prepare(feeds: dict[str, np.ndarray]) -> Callable[[], object]:
        def call() -> None:
            if feeds["input0"].shape == TINY_MAX:
                raise RuntimeError("boom at max\nsecond line")

        return call

    return OpenCandidate(prepare, threads=1)


def unavailable_here(spec: CandidateSpec) -> OpenCandidate:
    raise BackendUnavailable("needs hardware this machine lacks (test)")


def factory(model_dir: Path, name: str, function: str) -> CandidateSpec:
    return CandidateSpec(name, "test", "a test candidate", "factory", str(model_dir), "value",
                         factory=f"{__name__}:{function}")


@needs_proc
def test_each_candidate_runs_in_its_own_process_and_a_crash_is_a_skip(ort_compiled: Path) -> None:
    extra = [factory(ort_compiled, "crasher", "crash_in_first_block_at_opt"),
             factory(ort_compiled, "raiser", "raise_at_max"), factory(ort_compiled, "absent", "unavailable_here")]
    report = run_bench(ort_compiled, "value", budget_s=0.05, torch_compile=False, extra_candidates=extra,
                       count_flops=False)
    [network] = report.networks
    skipped = {s.candidate: s.reason for s in network.skipped}
    assert skipped["absent"] == "needs hardware this machine lacks (test)"
    assert skipped["crasher"] == f"failed at opt {{'input0': {list(TINY_OPT)}}}: worker exited with code 3"
    assert skipped["raiser"] == f"failed at max {{'input0': {list(TINY_MAX)}}}: RuntimeError: boom at max"
    real = runnable_backends(ort_compiled, "value") | {"rlopt auto", "torchscript module"} | ORT_BASELINES
    rows = {s.point: {r.candidate for r in s.results} for s in network.shapes}
    assert rows == {"min": real | {"crasher", "raiser"}, "opt": real | {"raiser"}, "max": real}
    assert set(network.candidates) == real  # what was still running at the end
    # one process per candidate that opened, none of them this one, and none left once the bench returned
    pids = [info.pid for info in network.workers.values()]
    assert set(network.workers) == real | {"crasher", "raiser"} and len(set(pids)) == len(pids)
    assert os.getpid() not in pids and network.workers["raiser"].threads == 1
    assert not [pid for pid in pids if process_alive(pid)] and not children_of(os.getpid())


def _watch_children(proc: subprocess.Popen[str], at_least: int, frozen: bool = False,
                    timeout_s: float = 120) -> set[int]:
    """Poll until `proc` has `at_least` workers at once (and one frozen); every child pid seen on the way."""
    seen: set[int] = set()
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and proc.poll() is None:
        now = children_of(proc.pid)
        seen |= now
        if len(now) >= at_least and (not frozen or any(process_state(pid) == "T" for pid in now)):
            return seen
        time.sleep(0.1)
    raise AssertionError(f"rlopt bench started {len(seen)} workers (rc {proc.poll()})")


def _default_sigint() -> None:
    """A terminal's job gets Ctrl-C; a test run started in the background (`cmd &` without job control) passes
    SIGINT on ignored, and Python keeps an ignored SIGINT ignored."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start_bench(model_dir: Path, output: int = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "rlopt", "bench", str(model_dir), "--network", "value",
                             "--budget", "60", "--no-flops", "--json"], stdout=output, stderr=output, text=True,
                            start_new_session=True, preexec_fn=_default_sigint)


def _kill_leftovers(proc: subprocess.Popen[str], workers: set[int]) -> None:
    """After a failed test: the bench and the workers it started, by pid, so none outlives the test."""
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    for pid in workers:
        if process_alive(pid):
            os.kill(pid, signal.SIGKILL)


def _wait_gone(pids: set[int], timeout_s: float = 30) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and any(process_alive(p) for p in pids):
        time.sleep(0.1)
    return [p for p in pids if process_alive(p)]


@pytest.mark.slow  # the killed-parent test below covers worker cleanup in the default run
@needs_proc
def test_ctrl_c_leaves_no_worker_behind(ort_compiled: Path) -> None:
    proc = _start_bench(ort_compiled)
    workers: set[int] = set()
    try:
        workers = _watch_children(proc, at_least=ORT_ONLY_WORKERS)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        _, stderr = proc.communicate(timeout=60)  # the workers share its stderr: this also waits for them
        assert proc.returncode == 130 and "Traceback" not in stderr, stderr
        assert not _wait_gone(workers)
    finally:
        _kill_leftovers(proc, workers)


@pytest.mark.slow  # kills a bench parent and waits for its workers to go: ~3-4 s
@needs_proc
def test_workers_die_with_a_killed_parent(ort_compiled: Path) -> None:
    proc = _start_bench(ort_compiled, subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        workers = _watch_children(proc, at_least=ORT_ONLY_WORKERS, frozen=True)
        proc.kill()  # SIGKILL: no finally runs in the parent; frozen workers must still go (PR_SET_PDEATHSIG)
        proc.wait(timeout=60)
        assert not _wait_gone(workers)
    finally:
        _kill_leftovers(proc, workers)

