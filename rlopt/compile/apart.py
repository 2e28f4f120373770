"""Subjects timed apart: each in a worker process of its own that opens only that subject, frozen between its
requests, with the rounds driven from here (`rounds.drive_rounds`), so that the subjects' blocks interleave.

Why one process per subject, frozen: ONNX Runtime's pool threads spin for 30-50 ms after a call. Two pool sessions
in one process (a configuration and its A/A twin) shared the cores with each other's spinning threads, so on
2 cores the twin read 1.5-2x apart from the configuration and the pool lost to one thread on noise. A frozen
process (SIGSTOP) runs nothing; only the subject being timed and this idle process are left on the cores, as in
`scripts/bench.py`, where each candidate has its process. A worker dies with this process (PR_SET_PDEATHSIG), so a
killed compile leaves no frozen worker behind. The manifest's latencies are timed the same way (`latency.py`),
every verified backend in a worker of its own, so they are what `rlopt bench` and `rlopt.load` see.
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
from collections.abc import Iterator, Mapping
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlopt.backends import BACKENDS
from rlopt.compile.rounds import (BUDGET_S, ROUNDS, AloneSet, Block, RoundOf, Rounds, Subjects, block_counts,
                                  drive_rounds, one_round)
from rlopt.manifest import NetworkRecord
from rlopt.reference import Reference
from rlopt.runtime.routes import Table

TIMEOUT_S = 120.0
# False: `auto` and the `latency` stage time every subject in the compiling process. The test suite sets it: it
# never reads how close a latency is to the truth, and an interpreter per subject is most of a tiny compile's cost.
ENABLED = True
WORKER_CODE = "from rlopt.compile.apart import worker_main; worker_main()"


class _Process:
    """One worker: a fresh interpreter (torch / ORT / TVM pools do not survive fork) in its own process group,
    frozen except while it answers a request. Its environment is a bench worker's: each backend's runtime-only
    settings (it never compiles) and TVM_BIND_THREADS=0 (else TVM pins the thread that opens it to one core)."""

    def __init__(self) -> None:
        package_root = str(Path(__file__).resolve().parents[2])
        env = {**dict(name_value for backend in BACKENDS.values() for name_value in backend.runtime_env),
               **os.environ, "TVM_BIND_THREADS": os.environ.get("TVM_BIND_THREADS", "0"),
               "PYTHONPATH": os.pathsep.join(filter(None, [package_root, os.environ.get("PYTHONPATH")]))}
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
    """The workers of `apart_rounds`: started at the first measurement (or by `kept_workers(start=True)`), kept
    for the next ones inside `kept_workers`, all closed when the last such context ends."""

    processes: list[_Process] = []
    kept = 0
    lock = threading.Lock()  # one measurement at a time: two at once would time each other

    @classmethod
    def take(cls, count: int) -> list[_Process]:
        cls.processes = [p for p in cls.processes if p.alive()]
        while len(cls.processes) < count:  # started together: their imports overlap
            cls.processes.append(_Process())
        return cls.processes[:count]

    @classmethod
    def close(cls) -> None:
        processes, cls.processes = cls.processes, []
        for process in processes:
            process.close()


@contextmanager
def kept_workers(start: bool = False) -> Iterator[None]:
    """Keep the workers of `apart_rounds` for every measurement inside (a compile's networks and passes); they
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


def apart_rounds(staging: Path, record: NetworkRecord, subjects: Subjects, labels: dict[str, str],
                 estimates_us: Table | None = None, budget_s: float = BUDGET_S, rounds: int = ROUNDS,
                 keep: bool = False, seed: int = 0, min_rounds: int = 1,
                 alongside: Mapping[str, RoundOf] | None = None) -> Rounds:
    """Each subject opened alone in a worker of its own and timed in interleaved rounds (`drive_rounds`: each round
    visits the workers in shuffled order; a worker times one block per shape label, the others frozen). `alongside`:
    subjects timed in this process, visited in the same rounds (keys apart from `subjects`'), so that a worker's
    figures and theirs come from the same moments of the host. `keep`: the workers keep their subjects open for the
    next call with the same ones (until `release_apart`). RuntimeError with the reason in one line when a worker
    fails."""
    assert record.reference is not None
    common = {"staging": str(staging), "record": record.model_dump(mode="json"), "labels": labels,
              "reference": str(staging / record.reference.path), "estimates_us": estimates_us or {}}
    with _Workers.lock:
        try:
            workers = dict(zip(subjects, _Workers.take(len(subjects))))
            for key, worker in workers.items():
                _answer(worker.ask({**common, "open": key, "subject": subjects[key]}), subjects)

            def round_of(worker: _Process) -> RoundOf:
                def blocks() -> dict[str, Block]:
                    timed = _answer(worker.ask({"round": True}), subjects)["blocks"]
                    return {label: Block(wall, cpu, calls) for label, (wall, cpu, calls) in timed.items()}
                return blocks

            timed = {**{k: round_of(w) for k, w in workers.items()}, **(alongside or {})}
            result = drive_rounds(timed, rounds, budget_s, min_rounds, seed)
            if not keep:
                for worker in workers.values():
                    worker.ask({"release": True})
        finally:
            if not _Workers.kept:
                _Workers.close()
    return result


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
    times one block per shape label, {"release": true} closes it."""
    _die_with_parent(int(sys.argv[1]))
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    held: _Held | None = None
    rng = random.Random(0)
    for line in sys.stdin:
        try:
            job = json.loads(line)
            answer: dict[str, Any]
            if "round" in job:
                if held is None:
                    raise RuntimeError("no subject is open")
                blocks = one_round(held.opened.configurations[f"alone {held.key}"], held.counts, rng)
                answer = {"blocks": {label: [b.wall, b.cpu, b.calls] for (_, label), b in blocks.items()}}
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


__all__ = ["ENABLED", "TIMEOUT_S", "apart_rounds", "kept_workers", "release_apart", "worker_main"]
