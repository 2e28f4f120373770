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


def block_median(call: Call, count: int) -> float:
    """Median of `count` timed calls; a block of several starts with an untimed call (a single call longer than
    a whole block's budget is not worth doubling)."""
    if count > 1:
        call()
    samples = []
    for _ in range(count):
        start = time.perf_counter_ns()
        call()
        samples.append(time.perf_counter_ns() - start)
    return float(np.median(samples)) / 1e3


def interleaved_medians(configurations: dict[str, Cells], rounds: int = ROUNDS, seed: int = 0,
                        estimates_us: Table | None = None,
                        budget_s: float = BUDGET_S) -> tuple[dict[str, dict[tuple[str, str], float]], int]:
    """Per configuration and (backend, shape) cell: the median over rounds of each round's block median, and
    the rounds done (at least one; no round starts once `budget_s` is spent).

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
    medians: dict[str, dict[tuple[str, str], list[float]]] = {c: {k: [] for k in cells}
                                                             for c, cells in configurations.items()}
    deadline, done = time.monotonic() + budget_s, 0
    while done < rounds and (done == 0 or time.monotonic() < deadline):
        for config in rng.sample(list(configurations), len(configurations)):
            cells = configurations[config]
            for cell in rng.sample(list(cells), len(cells)):
                time.sleep(GAP_S)
                medians[config][cell].append(block_median(cells[cell], counts[config, cell]))
            time.sleep(SETTLE_S)
        done += 1
    return {c: {k: float(np.median(v)) for k, v in cells.items()} for c, cells in medians.items()}, done


Subjects = dict[str, tuple[str, dict[str, Any]]]  # key -> (backend, facts it is opened with)


def open_subject(staging: Path, record: NetworkRecord, backend: str, facts: dict[str, Any]) -> Runner:
    """`backend`'s artifact of `record` (under `staging`) opened with `facts`."""
    artifact = record.artifacts[backend]
    assert artifact.path is not None
    return open_runner(backend, staging / artifact.path, list(record.inputs), facts)


def alone_medians(staging: Path, record: NetworkRecord, reference: Reference, subjects: Subjects,
                  labels: dict[str, str], estimates_us: Table | None = None) -> tuple[Table, int]:
    """Each subject opened alone (`alone <key>` configurations) and timed in interleaved rounds, in this process:
    us per shape label per key, and the rounds done."""
    opened: list[Runner] = []
    try:
        configurations: dict[str, Cells] = {}
        for key, (backend, facts) in subjects.items():
            opened.append(open_subject(staging, record, backend, facts))
            configurations[f"alone {key}"] = subject_cells(key, opened[-1], backend, record, reference, labels)
        medians, rounds = interleaved_medians(configurations, estimates_us=estimates_us)
    finally:
        for runner in opened:
            runner.close()
    return {k: {label: round(medians[f"alone {k}"][k, label], 2) for label in labels} for k in subjects}, rounds


class _Worker:
    """The process `fresh_process_medians` sends its jobs to: started at the first, kept for the next ones inside
    `kept_worker` (each job opens its runners and closes them, so it opens nothing else while it times; starting
    an interpreter for each took 0.5 s). It reads one job per line on stdin and answers one line; it exits when this
    process closes its stdin (or dies)."""

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
                          estimates_us: Table | None = None) -> tuple[Table, int]:
    """`alone_medians` in another interpreter that opens nothing else. Raises RuntimeError with the reason in one
    line when it fails."""
    assert record.reference is not None
    with _Worker.lock:
        try:
            answer = _Worker.ask({"staging": str(staging), "record": record.model_dump(mode="json"),
                                  "reference": str(staging / record.reference.path), "subjects": subjects,
                                  "labels": labels, "estimates_us": estimates_us or {}})
        finally:
            if not _Worker.kept:
                _Worker.close()
    if "error" in answer:
        raise RuntimeError(f"timing {', '.join(subjects)} in a fresh process failed: {answer['error']}")
    return answer["alone_us"], int(answer["rounds"])


def fresh_process_main() -> None:
    """The worker: jobs (JSON lines) on stdin, answers (JSON lines) on stdout; a library's prints go to stderr."""
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    for line in sys.stdin:
        try:
            job = json.loads(line)
            record = NetworkRecord.model_validate(job["record"])
            reference = Reference.load(Path(job["reference"]), list(record.inputs), list(record.outputs))
            subjects = {key: (backend, facts) for key, (backend, facts) in job["subjects"].items()}
            alone, rounds = alone_medians(Path(job["staging"]), record, reference, subjects, job["labels"],
                                          job["estimates_us"])
            answer: dict[str, Any] = {"alone_us": alone, "rounds": rounds}
        except Exception as exc:  # the parent reports it in one line
            text = str(exc).strip()
            answer = {"error": f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


__all__ = ["BUDGET_S", "CELL_BUDGET_S", "ROUNDS", "SETTLE_S", "Call", "Cells", "Subjects", "alone_medians",
           "block_median", "fresh_process_main", "fresh_process_medians", "interleaved_medians", "kept_worker",
           "open_subject", "session_calls", "subject_cells"]
