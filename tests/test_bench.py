"""rlopt bench: the candidates, their worker processes, the interleaving, the report. Never a wall-clock threshold."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

from rlopt.bench import (
    BLOCK_CALLS,
    WARMUP_CALLS,
    CandidateFailed,
    CandidateSpec,
    OpenCandidate,
    run_bench,
    time_interleaved,
)
from rlopt.errors import BackendUnavailable
from rlopt.manifest import read_manifest
from rlopt.backends import unavailable_reason
from tests.conftest import assert_one_line_error, run_rlopt, write_tiny_recipe

CORES = len(os.sched_getaffinity(0))
ORT_BASELINES = {"onnxruntime 1 thread"} | ({f"onnxruntime {CORES} threads"} if CORES > 1 else set())


def tiny_recipe(tiny_compiled: Path) -> Path:
    return tiny_compiled.parent / "tiny.yaml"


def runnable_backends(model_dir: Path, network: str) -> set[str]:
    """`rlopt <backend>` for every backend the manifest says is verified and that can run on this machine."""
    record = read_manifest(model_dir).networks[network]
    return {f"rlopt {name}" for name, artifact in record.artifacts.items()
            if artifact.verified and unavailable_reason(name, artifact.facts) is None}


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
    predecessors = {(x, y) for r in rounds for x, y in zip(r, r[1:])}
    assert len(predecessors) > 2, "no runner always follows the same one"
    again: list[str] = []
    time_interleaved({n: FakeRunner(n, again) for n in "abc"}, budget_s=0.0, min_rounds=3, max_rounds=3)
    assert again == log, "the order is seeded: runs are repeatable"


def test_a_runner_that_dies_mid_rounds_is_dropped_and_the_others_go_on() -> None:
    log: list[str] = []
    runners = {"a": FakeRunner("a", log), "dies": FakeRunner("dies", log, fail_block_at=2), "c": FakeRunner("c", log)}
    samples, first_ms, failures = time_interleaved(runners, budget_s=0.0, min_rounds=4, max_rounds=4)
    assert failures == {"dies": "worker exited with code 3"}  # a CandidateFailed's message is the reason as is
    assert set(samples) == set(first_ms) == {"a", "c"}
    assert log.count("dies") == 1 and log.count("a") == log.count("c") == 4
    assert samples["a"].size == 4 * (BLOCK_CALLS - 1)


def check_shapes(network: dict[str, Any], expected: set[str]) -> None:
    assert [s["point"] for s in network["shapes"]] == ["min", "opt", "max"]
    for shape in network["shapes"]:
        names = {r["candidate"] for r in shape["results"]}
        assert names == expected, names
        assert shape["rounds"] > 0 and shape["ort_best"] in ORT_BASELINES | {"rlopt onnxruntime"}
        medians = [r["median_us"] for r in shape["results"]]
        assert medians == sorted(medians)
        for row in shape["results"]:
            assert 0 < row["median_us"] <= row["p99_us"] and row["calls"] >= shape["rounds"]
            assert row["ratio_to_ort_best"] > 0
        best = next(r for r in shape["results"] if r["candidate"] == shape["ort_best"])
        assert best["ratio_to_ort_best"] == 1.0


def test_cli_json_without_recipe_skips_eager_with_the_reason(tiny_compiled: Path) -> None:
    proc = run_rlopt("bench", str(tiny_compiled), "--network", "value", "--budget", "0.05", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kind"] == "rlopt-bench" and report["machine"]["threads"]["usable_cores"] == CORES
    [network] = report["networks"]
    assert network["network"] == "value" and network["eager_source"] is None
    rlopt_rows = runnable_backends(tiny_compiled, "value")
    assert {"rlopt torchscript", "rlopt onnxruntime", "rlopt tvm"} <= rlopt_rows
    check_shapes(network, rlopt_rows | {"rlopt auto", "torchscript module"} | ORT_BASELINES)
    assert report["isolation"] == "process"
    pids = [w["pid"] for w in network["workers"].values()]
    assert set(network["workers"]) == rlopt_rows | {"rlopt auto", "torchscript module"} | ORT_BASELINES
    assert len(set(pids)) == len(pids) and not [pid for pid in pids if process_alive(pid)]
    assert network["workers"]["rlopt auto"]["backend"] in {row.split()[1] for row in rlopt_rows}
    assert network["workers"]["onnxruntime 1 thread"]["threads"] == 1
    skipped = {s["candidate"]: s["reason"] for s in network["skipped"]}
    assert "pass --recipe RECIPE" in skipped["pytorch eager"]
    assert "eager" in skipped["torch.compile"]
    assert ("rlopt tensorrt" in skipped) == ("rlopt tensorrt" not in rlopt_rows)


def test_eager_baseline_from_the_recipe_reproduces_the_reference(tiny_compiled: Path) -> None:
    report = run_bench(tiny_compiled, "policy", tiny_recipe(tiny_compiled), budget_s=0.05, torch_compile=False)
    [network] = report.networks
    assert network.eager_source == f"recipe {tiny_recipe(tiny_compiled)}"
    check_shapes(network.model_dump(), runnable_backends(tiny_compiled, "policy")
                 | {"rlopt auto", "pytorch eager", "torchscript module"} | ORT_BASELINES)
    selected = read_manifest(tiny_compiled).networks["policy"].selected
    assert network.candidates[f"rlopt {selected}"].endswith("(selected by auto)")
    assert network.candidates["pytorch eager"] == f"the nn.Module from recipe {tiny_recipe(tiny_compiled)}"
    assert {s.candidate: s.reason for s in network.skipped}["torch.compile"] == "not requested"
    # FLOPs are counted (2 * rows * (32*16 + 16*16 + 16*5) for the policy MLP), so GFLOP/s is reported
    assert network.shapes[0].gflop == pytest.approx(2 * 1 * (32 * 16 + 16 * 16 + 16 * 5) / 1e9)
    assert all(r.gflops_per_s and r.gflops_per_s > 0 for r in network.shapes[0].results)


def test_human_table(tiny_compiled: Path) -> None:
    proc = run_rlopt("bench", str(tiny_compiled), "--network", "policy", "--budget", "0.05")
    assert proc.returncode == 0, proc.stderr
    assert "x ORT best" in proc.stdout and "onnxruntime 1 thread" in proc.stdout and "not run:" in proc.stdout


def test_a_recipe_for_another_model_is_one_line_exit_2(tiny_compiled: Path, tmp_path: Path) -> None:
    other = write_tiny_recipe(tmp_path, extra="")
    other.write_text(other.read_text().replace("seed: 3", "seed: 4"))
    proc = run_rlopt("bench", str(tiny_compiled), "--recipe", str(other), "--budget", "0.05")
    assert_one_line_error(proc, 2, str(other), "model", "differs from the model MODEL_DIR was compiled from")


def test_unknown_network_is_one_line_exit_2(tiny_compiled: Path) -> None:
    proc = run_rlopt("bench", str(tiny_compiled), "--network", "critic")
    assert_one_line_error(proc, 2, "networks", "no network 'critic'")


@pytest.mark.slow
def test_every_baseline_including_torch_compile(tiny_compiled: Path) -> None:
    proc = run_rlopt("bench", str(tiny_compiled), "--network", "policy", "--recipe", str(tiny_recipe(tiny_compiled)),
                     "--budget", "0.1", "--json")
    assert proc.returncode == 0, proc.stderr
    [network] = json.loads(proc.stdout)["networks"]
    check_shapes(network, runnable_backends(tiny_compiled, "policy")
                 | {"rlopt auto", "pytorch eager", "torchscript module", "torch.compile"} | ORT_BASELINES)


# ----------------------------------------------------------------------------------------------------------------
# Worker processes: isolation, a crashing or failing candidate, cleanup. The factories below run in the workers.

TINY_OPT, TINY_MAX = (2, 3, 32), (4, 6, 32)  # conftest's tiny recipe


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


def process_state(pid: int) -> str | None:
    """'R', 'S', 'T' (stopped: a frozen worker), 'Z'...; None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def process_alive(pid: int) -> bool:
    """Running or stopped; a zombie (exited, not yet reaped by whoever adopted it) counts as gone."""
    return process_state(pid) not in (None, "Z")


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry.name))
    return found


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")


@needs_proc
def test_each_candidate_runs_in_its_own_process_and_a_crash_is_a_skip(tiny_compiled: Path) -> None:
    extra = [factory(tiny_compiled, "crasher", "crash_in_first_block_at_opt"),
             factory(tiny_compiled, "raiser", "raise_at_max"), factory(tiny_compiled, "absent", "unavailable_here")]
    report = run_bench(tiny_compiled, "value", budget_s=0.05, torch_compile=False, extra_candidates=extra)
    [network] = report.networks
    skipped = {s.candidate: s.reason for s in network.skipped}
    assert skipped["absent"] == "needs hardware this machine lacks (test)"
    assert skipped["crasher"] == f"failed at opt {{'input0': {list(TINY_OPT)}}}: worker exited with code 3"
    assert skipped["raiser"] == f"failed at max {{'input0': {list(TINY_MAX)}}}: RuntimeError: boom at max"
    real = runnable_backends(tiny_compiled, "value") | {"rlopt auto", "torchscript module"} | ORT_BASELINES
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


def _start_bench(model_dir: Path, output: int = subprocess.PIPE) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "rlopt", "bench", str(model_dir), "--network", "value",
                             "--budget", "60", "--json"], stdout=output, stderr=output, text=True,
                            start_new_session=True)


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


@needs_proc
def test_ctrl_c_leaves_no_worker_behind(tiny_compiled: Path) -> None:
    proc = _start_bench(tiny_compiled)
    workers: set[int] = set()
    try:
        workers = _watch_children(proc, at_least=6)
        time.sleep(1.0)
        os.killpg(proc.pid, signal.SIGINT)  # what a terminal's Ctrl-C does: the whole foreground group
        _, stderr = proc.communicate(timeout=60)  # the workers share its stderr: this also waits for them
        assert proc.returncode == 130 and "Traceback" not in stderr, stderr
        assert not _wait_gone(workers)
    finally:
        _kill_leftovers(proc, workers)


@needs_proc
def test_workers_die_with_a_killed_parent(tiny_compiled: Path) -> None:
    proc = _start_bench(tiny_compiled, subprocess.DEVNULL)
    workers: set[int] = set()
    try:
        workers = _watch_children(proc, at_least=6, frozen=True)
        proc.kill()  # SIGKILL: no finally runs in the parent; frozen workers must still go (PR_SET_PDEATHSIG)
        proc.wait(timeout=60)
        assert not _wait_gone(workers)
    finally:
        _kill_leftovers(proc, workers)


def _bench_script() -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location("rlopt_bench_script", Path(__file__).parents[1] / "scripts" / "bench.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_target_needs_reads_a_target_as_shares_of_the_machines_roofs() -> None:
    script = _bench_script()
    # opt: 0.6 x 100 us = 60 us; 0.03 GFLOP in 60 us = 500 GFLOP/s = 125% of a 400 GFLOP/s peak; a 15 us read = 25%
    assert script.target_needs("opt", 100.0, 0.03, 400.0, 15.0) == "60.0 us (125% of FMA peak, 25% on reading the weights)"
    assert script.target_needs("min", 10.0, None, None, None) == "3.5 us"
    assert script.target_needs("extra", 10.0, 0.1, 400.0, 1.0) == "-"  # shapes without a target


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build scripts/roofline.c")
def test_roofline_measures_a_peak_and_a_cache_read_that_grows_with_size(tmp_path: Path) -> None:
    script = _bench_script()
    roofline = script.Roofline(tmp_path)
    assert roofline.binary is not None, roofline.reason
    assert roofline.peak_gflops(1) > 1.0
    small, large = roofline.read_us(64 * 1024), roofline.read_us(8 * 1024 * 1024)
    assert 0 < small < large


def test_roofline_without_a_compiler_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _bench_script()
    monkeypatch.setenv("CC", "no-such-compiler-here")
    roofline = script.Roofline(tmp_path)
    assert roofline.binary is None and "no C compiler" in roofline.reason
    assert roofline.peak_gflops(2) is None and roofline.read_us(1024) is None
