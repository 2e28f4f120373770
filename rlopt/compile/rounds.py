"""Interleaved rounds of timed blocks: how `auto`'s measurement times its configurations, here or in a fresh process.

A configuration is a set of (subject, shape label) cells, each a call through a Session (the runtime's own path).
`fresh_process_medians` runs the same rounds in another interpreter that opens only the subjects it is given: a
backend alone, as a session that routes everything to it runs it, with no other backend's pool in the process.
"""

from __future__ import annotations

import json
import os
import random
import select
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends import Runner, open_runner
from rlopt.manifest import NetworkRecord
from rlopt.reference import Reference
from rlopt.runtime import Session, unbucketed_variant
from rlopt.runtime.routes import OTHER, Table
from rlopt.timing import warm_until_steady

ROUNDS = 15
BURST_CALLS = 7  # timed calls per (backend, shape) block after one untimed: the bench protocol's block of 8
CELL_BUDGET_S = 0.005  # ... fewer where that many would take longer than this (at least one)
GAP_S = 0.001  # idle before each block: a bench worker is woken for its block, a serving loop calls between steps
SETTLE_S = 0.005  # pause between configurations, so the pools of the last one stop spinning first
BUDGET_S = 3.0  # no measuring round starts after this long (a heavy network on a busy machine gets fewer rounds)
WARM_CAP_S = 1.0  # the most one cell is warmed before the rounds
FRESH_TIMEOUT_S = 120.0
Call = Callable[[], object]
Cells = dict[tuple[str, str], Call]


def session_calls(runner: Runner, name: str, record: NetworkRecord, reference: Reference,
                  labels: dict[str, str]) -> dict[str, Call]:
    """A call per shape label through a Session (the runtime's own path, bound calls included); OTHER is the path
    that serves shapes without their own build, at opt."""
    session = Session({name: runner}, {}, name, name, record)
    calls: dict[str, Call] = {label: (lambda f=reference.feeds(p, 0): session.run(f)) for label, p in labels.items()
                              if label != OTHER}
    if OTHER in labels:
        feeds = reference.feeds(labels[OTHER], 0)
        variant = unbucketed_variant(name, record.artifacts[name].facts)
        infer = {**runner.parity_variants(), **runner.gated_variants()}.get(variant) if variant else None
        calls[OTHER] = (lambda: infer(feeds)) if infer is not None else (lambda: session.run(feeds))
    return calls


def subject_cells(key: str, runner: Runner, backend: str, record: NetworkRecord, reference: Reference,
                  labels: dict[str, str]) -> Cells:
    """`session_calls` as the cells of subject `key`: one (key, shape label) cell per label."""
    return {(key, label): call for label, call in session_calls(runner, backend, record, reference, labels).items()}


def timed_block(call: Call, count: int) -> tuple[float, float]:
    """Median of `count` timed calls, and the median of the calling thread's CPU time per call, both in us; a block
    of several starts with an untimed call (a single call longer than a whole block's budget is not worth
    doubling). The CPU time does not count the time this thread waited for a core: for a call that computes on the
    calling thread alone it is what the call costs whatever else runs on the machine (the median, as the wall
    figure's: a block's mean counted the first call after the idle gap, whose cold caches cost a 19 us TVM call
    36 us)."""
    if count > 1:
        call()
    walls, cpus = [], []
    for _ in range(count):
        cpu = time.thread_time_ns()
        start = time.perf_counter_ns()
        call()
        walls.append(time.perf_counter_ns() - start)
        cpus.append(time.thread_time_ns() - cpu)
    return float(np.median(walls)) / 1e3, float(np.median(cpus)) / 1e3


def block_median(call: Call, count: int) -> float:
    """`timed_block`'s median."""
    return timed_block(call, count)[0]


Medians = dict[str, dict[tuple[str, str], float]]  # configuration -> (subject, shape label) -> us


def interleaved_medians(configurations: dict[str, Cells], rounds: int = ROUNDS, seed: int = 0,
                        estimates_us: Table | None = None,
                        budget_s: float = BUDGET_S) -> tuple[Medians, Medians, int]:
    """Per configuration and (backend, shape) cell: the median over rounds of each round's block median, the
    median over rounds of the calling thread's CPU time per call (`timed_block`), and the rounds done (at least
    one; no round starts once `budget_s` is spent).

    Each round visits the configurations in shuffled order, and a configuration's cells in shuffled order (in a
    mixed configuration, calls switch backends as a mixed session's do). A block is the bench protocol's: after
    GAP_S idle, one untimed call and up to BURST_CALLS timed ones (`estimates_us[backend][shape]` cuts a slow
    call's block to CELL_BUDGET_S; default: one timed call per cell). The idle gap is why: calls back to back time a
    warm loop the bench never runs, and flatter a thread pool whose workers are still spinning from the last call."""
    rng = random.Random(seed)
    counts: dict[tuple[str, tuple[str, str]], int] = {}
    for config, cells in configurations.items():
        for cell, call in cells.items():
            # a fresh runner's first calls are not its speed (a JIT specializing, a pool starting; a Session binds
            # its per-thread call on the second call of a signature)
            warm_until_steady(call, cap_s=WARM_CAP_S, clock=time.perf_counter_ns)
            known = (estimates_us or {}).get(cell[0], {}).get(cell[1])
            estimate = float(known) if known else block_median(call, 1)
            counts[config, cell] = int(min(BURST_CALLS, max(1, CELL_BUDGET_S * 1e6 / max(estimate, 1.0))))
    walls: dict[str, dict[tuple[str, str], list[float]]] = {c: {k: [] for k in cells}
                                                           for c, cells in configurations.items()}
    cpus: dict[str, dict[tuple[str, str], list[float]]] = {c: {k: [] for k in cells}
                                                          for c, cells in configurations.items()}
    deadline, done = time.monotonic() + budget_s, 0
    while done < rounds and (done == 0 or time.monotonic() < deadline):
        for config in rng.sample(list(configurations), len(configurations)):
            cells = configurations[config]
            for cell in rng.sample(list(cells), len(cells)):
                time.sleep(GAP_S)
                wall, cpu = timed_block(cells[cell], counts[config, cell])
                walls[config][cell].append(wall)
                cpus[config][cell].append(cpu)
            time.sleep(SETTLE_S)
        done += 1

    def medians(samples: dict[str, dict[tuple[str, str], list[float]]]) -> Medians:
        return {c: {k: float(np.median(v)) for k, v in cells.items()} for c, cells in samples.items()}

    return medians(walls), medians(cpus), done


Subjects = dict[str, tuple[str, dict[str, Any]]]  # key -> (backend, facts it is opened with)


def open_subject(staging: Path, record: NetworkRecord, backend: str, facts: dict[str, Any]) -> Runner:
    """`backend`'s artifact of `record` (under `staging`) opened with `facts`."""
    artifact = record.artifacts[backend]
    assert artifact.path is not None
    return open_runner(backend, staging / artifact.path, list(record.inputs), facts)


class AloneSet:
    """Subjects opened alone (an `alone <key>` configuration each), kept open for several timings: `time` runs
    interleaved rounds over them, `close` closes every runner."""

    def __init__(self, staging: Path, record: NetworkRecord, reference: Reference, subjects: Subjects,
                 labels: dict[str, str]) -> None:
        self.subjects, self.labels = subjects, labels
        self.opened: list[Runner] = []
        self.configurations: dict[str, Cells] = {}
        try:
            for key, (backend, facts) in subjects.items():
                self.opened.append(open_subject(staging, record, backend, facts))
                self.configurations[f"alone {key}"] = subject_cells(key, self.opened[-1], backend, record, reference,
                                                                    labels)
        except BaseException:
            self.close()
            raise

    def time(self, estimates_us: Table | None = None, budget_s: float = BUDGET_S,
             rounds: int = ROUNDS) -> tuple[Table, Table, int]:
        """us per shape label per key (wall, and the calling thread's CPU time per call), and the rounds done."""
        walls, cpus, done = interleaved_medians(self.configurations, rounds=rounds, estimates_us=estimates_us,
                                                budget_s=budget_s)

        def table(medians: Medians) -> Table:
            return {k: {label: round(medians[f"alone {k}"][k, label], 2) for label in self.labels}
                    for k in self.subjects}

        return table(walls), table(cpus), done

    def close(self) -> None:
        for runner in self.opened:
            runner.close()
        self.opened, self.configurations = [], {}


def alone_medians(staging: Path, record: NetworkRecord, reference: Reference, subjects: Subjects,
                  labels: dict[str, str], estimates_us: Table | None = None,
                  budget_s: float = BUDGET_S) -> tuple[Table, Table, int]:
    """Each subject opened alone and timed in interleaved rounds, in this process (`AloneSet`, closed after)."""
    opened = AloneSet(staging, record, reference, subjects, labels)
    try:
        return opened.time(estimates_us, budget_s)
    finally:
        opened.close()


class _Worker:
    """The process `fresh_process_medians` sends its jobs to: started at the first, kept for the next ones inside
    `kept_worker` (a job opens its runners and closes them, or keeps them for the next job with the same subjects
    until `release_fresh`, so it opens nothing else while it times; starting an interpreter for each took 0.5 s).
    It reads one job per line on stdin and answers one line; it exits when this process closes its stdin (or
    dies)."""

    process: subprocess.Popen[str] | None = None
    kept = 0  # open `kept_worker` contexts
    lock = threading.Lock()  # one job at a time: two timings at once would time each other

    @classmethod
    def start(cls) -> subprocess.Popen[str]:
        process = cls.process
        if process is None or process.poll() is not None:
            package_root = str(Path(__file__).resolve().parents[2])
            env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root,
                                                                             os.environ.get("PYTHONPATH")])))
            process = cls.process = subprocess.Popen(
                [sys.executable, "-c", "from rlopt.compile.rounds import fresh_process_main; fresh_process_main()"],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env)
        return process

    @classmethod
    def ask(cls, job: dict[str, Any]) -> dict[str, Any]:
        process = cls.start()
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.write(json.dumps(job) + "\n")
            process.stdin.flush()
            ready, _, _ = select.select([process.stdout], [], [], FRESH_TIMEOUT_S)
            line = process.stdout.readline() if ready else ""
        except OSError:
            line = ""
        if not line:
            cls.close()
            return {"error": "it exited or did not answer" if ready else f"no answer in {FRESH_TIMEOUT_S:g} s"}
        return dict(json.loads(line))

    @classmethod
    def close(cls) -> None:
        process, cls.process = cls.process, None
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None
        with suppress(OSError):  # a worker that died leaves a broken pipe behind
            process.stdin.close()
        process.kill()  # it holds nothing to flush; its interpreter's shutdown took 0.1-0.2 s of the compile
        process.wait()
        process.stdout.close()


@contextmanager
def kept_worker(start: bool = False) -> Iterator[None]:
    """Keep the worker of `fresh_process_medians` for every measurement inside (a compile's networks and retries);
    it exits at the end, so no process outlives the compile. `start` starts it now: its interpreter and imports
    (0.5 s) then load while the compile's first stages run."""
    with _Worker.lock:
        _Worker.kept += 1
        if start:
            _Worker.start()
    try:
        yield
    finally:
        with _Worker.lock:
            _Worker.kept -= 1
            if not _Worker.kept:
                _Worker.close()


def fresh_process_medians(staging: Path, record: NetworkRecord, subjects: Subjects, labels: dict[str, str],
                          estimates_us: Table | None = None, budget_s: float = BUDGET_S, rounds: int = ROUNDS,
                          keep: bool = False) -> tuple[Table, Table, int]:
    """`alone_medians` in another interpreter that opens nothing else; `keep`: its runners stay open for the next
    call with the same subjects (until `release_fresh`). Raises RuntimeError with the reason in one line when it
    fails."""
    assert record.reference is not None
    with _Worker.lock:
        try:
            answer = _Worker.ask({"staging": str(staging), "record": record.model_dump(mode="json"),
                                  "reference": str(staging / record.reference.path), "subjects": subjects,
                                  "labels": labels, "estimates_us": estimates_us or {}, "budget_s": budget_s,
                                  "rounds": rounds, "keep": keep})
        finally:
            if not _Worker.kept:
                _Worker.close()
    if "error" in answer:
        raise RuntimeError(f"timing {', '.join(subjects)} in a fresh process failed: {answer['error']}")
    return answer["alone_us"], answer["cpu_us"], int(answer["rounds"])


def release_fresh() -> None:
    """Close the runners the worker kept open (`keep`); nothing when there is no worker."""
    with _Worker.lock:
        if _Worker.process is not None and _Worker.process.poll() is None:
            _Worker.ask({"release": True})


def fresh_process_main() -> None:
    """The worker: jobs (JSON lines) on stdin, answers (JSON lines) on stdout; a library's prints go to stderr."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    held: tuple[str, AloneSet] | None = None
    for line in sys.stdin:
        try:
            job = json.loads(line)
            identity = json.dumps([job.get(k) for k in ("staging", "reference", "subjects", "labels")])
            if held is not None and (job.get("release") or held[0] != identity):
                held[1].close()
                held = None
            if job.get("release"):
                answer: dict[str, Any] = {"released": True}
            else:
                if held is None:
                    record = NetworkRecord.model_validate(job["record"])
                    reference = Reference.load(Path(job["reference"]), list(record.inputs), list(record.outputs))
                    subjects = {key: (backend, facts) for key, (backend, facts) in job["subjects"].items()}
                    held = identity, AloneSet(Path(job["staging"]), record, reference, subjects, job["labels"])
                try:
                    alone, cpu, rounds = held[1].time(job["estimates_us"], job["budget_s"], job["rounds"])
                finally:
                    if not job.get("keep"):
                        held[1].close()
                        held = None
                answer = {"alone_us": alone, "cpu_us": cpu, "rounds": rounds}
        except Exception as exc:  # the parent reports it in one line
            text = str(exc).strip()
            answer = {"error": f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


__all__ = ["BUDGET_S", "CELL_BUDGET_S", "ROUNDS", "SETTLE_S", "AloneSet", "Call", "Cells", "Medians", "Subjects",
           "alone_medians", "release_fresh",
           "block_median", "fresh_process_main", "timed_block", "fresh_process_medians", "interleaved_medians", "kept_worker",
           "open_subject", "session_calls", "subject_cells"]
