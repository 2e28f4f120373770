"""Subjects timed apart: each in a worker process of its own that opens only that subject, frozen between its
requests, with the rounds driven from here so that the subjects' blocks interleave as `interleaved_medians` does.

Why one process per subject, frozen: ONNX Runtime's pool threads spin for 30-50 ms after a call. Two pool sessions
in one process (a configuration and its A/A twin) shared the cores with each other's spinning threads, so on
2 cores the twin read 1.5-2x apart from the configuration and the pool lost to one thread on noise. A frozen
process (SIGSTOP) runs nothing; only the subject being timed and this idle process are left on the cores, as in
`scripts/bench.py`, where each candidate has its process. A worker dies with this process (PR_SET_PDEATHSIG), so a
killed compile leaves no frozen worker behind. Verify's latencies (`apart_latencies`) are timed the same way, one
worker per backend, so the manifest records what `rlopt bench` and `rlopt.load` see, not this process's state.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends import open_runner
from rlopt.compile.rounds import ROUNDS, BUDGET_S, AloneSet, Subjects, block_counts, one_round, point_latencies
from rlopt.manifest import NetworkRecord
from rlopt.reference import Reference
from rlopt.runtime.routes import Table
from rlopt.timing import LatencyStats

TIMEOUT_S = 120.0
ENABLED = True  # False: `auto` times every subject in the compiling process (the test suite, which never reads how
#                 close a latency is to the truth: one interpreter per subject is most of a tiny compile's cost)
WORKER_CODE = "from rlopt.compile.apart import worker_main; worker_main()"


class _Process:
    """One worker: a fresh interpreter (torch / ORT / TVM pools do not survive fork) in its own process group,
    frozen except while it answers a request."""

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")])))
        self.popen = subprocess.Popen([sys.executable, "-c", WORKER_CODE, str(os.getpid())], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
                                      start_new_session=True)

    def alive(self) -> bool:
        return self.popen.poll() is None

    def _signal(self, signum: int) -> None:
        if self.alive():
            with suppress(ProcessLookupError, PermissionError):
                os.killpg(self.popen.pid, signum)

    def ask(self, job: dict[str, Any]) -> dict[str, Any]:
        """The answer to one job; {"error": ...} when the worker died or did not answer in TIMEOUT_S."""
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self._signal(signal.SIGCONT)
        try:
            self.popen.stdin.write(json.dumps(job) + "\n")
            self.popen.stdin.flush()
            ready, _, _ = select.select([self.popen.stdout], [], [], TIMEOUT_S)
            line = self.popen.stdout.readline() if ready else ""
        except OSError:
            ready, line = True, ""
        finally:
            self._signal(signal.SIGSTOP)
        if not line:
            self.close()
            return {"error": "it exited or did not answer" if ready else f"no answer in {TIMEOUT_S:g} s"}
        return dict(json.loads(line))

    def close(self) -> None:
        """Kill it (it holds nothing to flush; SIGKILL ends a frozen process too) and reap it."""
        with suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        self.popen.wait()
        for stream in (self.popen.stdin, self.popen.stdout):
            with suppress(OSError):
                if stream is not None:
                    stream.close()


class _Workers:
    """The workers of `apart_medians`: started at the first measurement (or by `kept_workers(start=True)`), kept
    for the next ones inside `kept_workers`, all closed when the last such context ends."""

    processes: list[_Process] = []
    named: dict[str, _Process] = {}  # `apart_latencies`' workers, one per backend
    kept = 0
    lock = threading.Lock()  # one measurement at a time: two at once would time each other

    @classmethod
    def take(cls, count: int) -> list[_Process]:
        cls.processes = [p for p in cls.processes if p.alive()]
        while len(cls.processes) < count:  # started together: their imports overlap
            cls.processes.append(_Process())
        return cls.processes[:count]

    @classmethod
    def own(cls, name: str) -> _Process:
        """The worker that `name` alone uses (started now when it has none or it died)."""
        if name not in cls.named or not cls.named[name].alive():
            cls.named[name] = _Process()
        return cls.named[name]

    @classmethod
    def close(cls) -> None:
        processes, cls.processes = [*cls.processes, *cls.named.values()], []
        cls.named = {}
        for process in processes:
            process.close()


@contextmanager
def kept_workers(start: bool = False) -> Iterator[None]:
    """Keep the workers of `apart_medians` for every measurement inside (a compile's networks and passes); they
    exit at the end, so no process outlives the compile. `start` starts one now: its interpreter and imports
    (0.5 s) then load while the compile's first stages run."""
    with _Workers.lock:
        _Workers.kept += 1
        if start and ENABLED:
            _Workers.take(1)
    try:
        yield
    finally:
        with _Workers.lock:
            _Workers.kept -= 1
            if not _Workers.kept:
                _Workers.close()


def apart_medians(staging: Path, record: NetworkRecord, subjects: Subjects, labels: dict[str, str],
                  estimates_us: Table | None = None, budget_s: float = BUDGET_S, rounds: int = ROUNDS,
                  keep: bool = False, seed: int = 0) -> tuple[Table, Table, int]:
    """Each subject opened alone in a worker of its own and timed in interleaved rounds (each round visits the
    workers in shuffled order; a worker times one block per shape label, the others frozen): wall and CPU medians
    per subject and label (us) and the rounds done. `keep`: the workers keep their subjects open for the next call
    with the same ones (until `release_apart`). RuntimeError with the reason in one line when a worker fails."""
    assert record.reference is not None
    common = {"staging": str(staging), "record": record.model_dump(mode="json"), "labels": labels,
              "reference": str(staging / record.reference.path), "estimates_us": estimates_us or {}}
    with _Workers.lock:
        try:
            workers = dict(zip(subjects, _Workers.take(len(subjects))))
            for key, worker in workers.items():
                _answer(worker.ask({**common, "open": key, "subject": subjects[key]}), subjects)
            rng = random.Random(seed)
            walls: dict[str, dict[str, list[float]]] = {k: {label: [] for label in labels} for k in subjects}
            cpus: dict[str, dict[str, list[float]]] = {k: {label: [] for label in labels} for k in subjects}
            deadline, done = time.monotonic() + budget_s, 0
            while done < rounds and (done == 0 or time.monotonic() < deadline):
                for key in rng.sample(list(workers), len(workers)):
                    timed = _answer(workers[key].ask({"round": done}), subjects)
                    for label, (wall, cpu) in timed["blocks"].items():
                        walls[key][label].append(wall)
                        cpus[key][label].append(cpu)
                done += 1
            if not keep:
                for worker in workers.values():
                    worker.ask({"release": True})
        finally:
            if not _Workers.kept:
                _Workers.close()

    def table(samples: dict[str, dict[str, list[float]]]) -> Table:
        return {k: {label: round(float(np.median(v)), 2) for label, v in cells.items()} for k, cells in samples.items()}

    return table(walls), table(cpus), done


def apart_latencies(backend: str, artifact: Path, facts: dict[str, Any], reference: Path, inputs: list[str],
                    outputs: list[str], points: list[str], budget_s: float) -> dict[str, LatencyStats]:
    """`point_latencies` of `backend`'s artifact, opened in a worker process of its own (one per backend, kept
    inside `kept_workers`), as `rlopt bench` times it: the compiling process's other runtimes, their pools and
    their warm caches are not in the figure. RuntimeError with the reason in one line when the worker fails."""
    job = {"latency": {"backend": backend, "artifact": str(artifact), "facts": facts, "reference": str(reference),
                       "inputs": inputs, "outputs": outputs, "points": points, "budget_s": budget_s}}
    with _Workers.lock:
        try:
            answer = _answer(_Workers.own(backend).ask(job), {backend: (backend, facts)})
        finally:
            if not _Workers.kept:
                _Workers.close()
    return {point: LatencyStats(p50, p99, int(iterations)) for point, (p50, p99, iterations)
            in answer["latency"].items()}


def _latency(job: dict[str, Any]) -> dict[str, list[float]]:
    """A worker's `apart_latencies` job: open, time, close."""
    reference = Reference.load(Path(job["reference"]), job["inputs"], job["outputs"])
    runner = open_runner(job["backend"], Path(job["artifact"]), job["inputs"], job["facts"])
    try:
        calls = {point: (lambda f=reference.feeds(point, 0): runner.infer(f)) for point in job["points"]}
        stats = point_latencies(calls, job["budget_s"])
    finally:
        runner.close()
    return {point: [s.p50_us, s.p99_us, s.iterations] for point, s in stats.items()}


def _answer(answer: dict[str, Any], subjects: Subjects) -> dict[str, Any]:
    if "error" in answer:
        raise RuntimeError(f"timing {', '.join(subjects)} in a fresh process failed: {answer['error']}")
    return answer


def release_apart() -> None:
    """Close the subjects the workers kept open (`keep`); nothing when there are no workers."""
    with _Workers.lock:
        for process in _Workers.processes:
            if process.alive():
                process.ask({"release": True})


def _die_with_parent(parent: int) -> None:
    """SIGKILL this worker when its parent dies (Linux), frozen or not; elsewhere a dead parent's closed pipe ends it
    once it is thawed."""
    with suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() != parent:  # it died before prctl took effect
        os._exit(0)


@dataclass
class _Held:
    """The one subject a worker has open: its key, what it was opened from, its runner and each cell's block size."""

    key: str
    identity: str
    opened: AloneSet
    counts: dict[tuple[str, str], int]


def _open(job: dict[str, Any], held: _Held | None) -> _Held:
    identity = json.dumps([job["staging"], job["reference"], job["subject"], job["labels"]])
    if held is not None and (held.key, held.identity) == (job["open"], identity):
        return held
    if held is not None:
        held.opened.close()
    record = NetworkRecord.model_validate(job["record"])
    reference = Reference.load(Path(job["reference"]), list(record.inputs), list(record.outputs))
    backend, facts = job["subject"]
    opened = AloneSet(Path(job["staging"]), record, reference, {job["open"]: (backend, facts)}, job["labels"])
    try:
        counts = block_counts(opened.configurations[f"alone {job['open']}"], job["estimates_us"])
    except BaseException:
        opened.close()
        raise
    return _Held(job["open"], identity, opened, counts)


def worker_main() -> None:
    """A worker: jobs (JSON lines) on stdin, answers (JSON lines) on stdout; a library's prints go to stderr.
    Jobs: {"open": key, "subject", ...} opens and warms one subject (kept when it is the one held), {"round": n}
    times one block per shape label, {"release": true} closes it; {"latency": ...} opens, times and closes an
    artifact (`apart_latencies`)."""
    _die_with_parent(int(sys.argv[1]))
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    held: _Held | None = None
    rng = random.Random(0)
    for line in sys.stdin:
        try:
            job = json.loads(line)
            answer: dict[str, Any]
            if "latency" in job:
                answer = {"latency": _latency(job["latency"])}
            elif "round" in job:
                if held is None:
                    raise RuntimeError("no subject is open")
                blocks = one_round(held.opened.configurations[f"alone {held.key}"], held.counts, rng)
                answer = {"blocks": {label: list(timed) for (_, label), timed in blocks.items()}}
            elif job.get("release"):
                if held is not None:
                    held.opened.close()
                    held = None
                answer = {"released": True}
            else:
                held = _open(job, held)
                answer = {"opened": held.key}
        except Exception as exc:  # the parent reports it in one line
            text = str(exc).strip()
            answer = {"error": f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"}
        out.write(json.dumps(answer) + "\n")
        out.flush()


__all__ = ["ENABLED", "TIMEOUT_S", "apart_latencies", "apart_medians", "kept_workers", "release_apart", "worker_main"]
