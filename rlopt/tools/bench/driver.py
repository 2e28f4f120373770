"""`rlopt bench`: every built backend next to the baselines a user would otherwise pick, per profile shape.

Which candidates and how each is opened: `candidates`. Each candidate lives in its own worker process
(`worker`: a fresh interpreter, not fork: torch, ONNX Runtime and TVM thread pools do not survive fork),
built there from a picklable `CandidateSpec`, with feeds read there from reference.npz. Users run one
backend per process; in one shared process the candidates' thread pools fought over the cores (TVM at the
max shape: 4 ms interleaved, 0.2 ms alone).
Timing stays interleaved round by round (a short block of calls of every candidate per round, the
order shuffled each round, seeded) so machine drift hits all alike: the parent asks one worker at a time for
a block and waits for its timings; the others are frozen (SIGSTOP) meanwhile, since a pipe read
alone leaves their pools spinning for 10-50 ms after a call (see `Worker`). Each
candidate gets WARMUP_CALLS untimed calls first, and each block's first call is untimed (see
`time_interleaved`). A worker that raises or dies is dropped with the reason; the others go on.
Reported (`analysis`): median and p99 of single calls, and median / (best ONNX Runtime median).
"""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlopt.errors import UsageError, describe_exception
from rlopt.manifest import Manifest, read_manifest
from rlopt.machine import load_average, machine_facts, usable_core_ids, usable_cores
from rlopt.tools.bench.analysis import (
    affinity_warnings,
    profile_points,
    round_medians_us,
    rounds_of,
    shape_results,
    torch_threads,
)
from rlopt.tools.bench.candidates import CandidateSpec, candidate_specs, check_recipe, is_yardstick, load_reference
from rlopt.tools.bench.schema import BenchReport, NetworkBench, ShapeBench, Skip, WorkerInfo
from rlopt.tools.bench.worker import BLOCK_CALLS, WARMUP_CALLS, WORKER_CODE, send

MIN_ROUNDS = 10
MAX_ROUNDS = 2000
DEFAULT_BUDGET_S = 2.0
OPEN_TIMEOUT_S = 600.0  # a worker imports torch / TVM and opens its candidate; torch.compile compiles on warmup
BLOCK_TIMEOUT_S = 60.0  # one block is a few calls: a worker silent this long is hung
EXIT_TIMEOUT_S = 5.0  # after "exit", before a worker is terminated, then killed

METHOD = ("each candidate in its own worker process (a fresh interpreter), the parent driving interleaved rounds: "
          f"per round each worker in turn runs a block of {BLOCK_CALLS} back-to-back calls, the first untimed, "
          "while the others are frozen (SIGSTOP); order shuffled each round (from the report's seed, a new one "
          "per run unless given, per network and shape); "
          f"{WARMUP_CALLS} untimed warmup calls per candidate and shape first; median and p99 of single calls; "
          "ratio = median / best ONNX Runtime median at that shape")


class CandidateFailed(Exception):
    """A candidate cannot go on; the message is the reason the report gives."""


class BlockRunner(Protocol):
    def warm(self) -> float:
        """Run WARMUP_CALLS untimed calls; return the first one's milliseconds."""

    def block(self, timed: int) -> np.ndarray:
        """One untimed call, then `timed` calls each timed; their nanoseconds."""


SIGSTOP: int | None = getattr(signal, "SIGSTOP", None)
SIGCONT: int | None = getattr(signal, "SIGCONT", None)


def exit_reason(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"worker exited with code {code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return f"worker exited with code {code}"


class Worker:
    """The parent's handle on one candidate's process; after `at(point)` it is the BlockRunner for that shape.

    A fresh interpreter (`python -c`, not fork: torch / ORT / TVM thread pools do not survive fork; not
    multiprocessing's spawn either, which re-runs the caller's main module) in its own session, so a
    terminal's Ctrl-C reaches only the parent, which then stops every worker. TVM_BIND_THREADS=0 is in its
    environment before anything is imported. If the parent dies, Linux kills the worker (PR_SET_PDEATHSIG).

    Between its requests a worker is frozen (SIGSTOP to its process group, SIGCONT before the next
    request): its main thread waits on the pipe, but ONNX Runtime's and TVM's pool threads spin for
    30-50 ms after a call and torch's OpenMP threads for ~10 ms, which on 2 cores stalled the next
    worker's calls by scheduler quanta (default recipe, max shape, all workers thawed: torch candidates
    12-25 ms medians for 0.5 ms calls, TVM 0.47 ms; frozen: 0.5-0.8 ms and 0.25-0.38 ms). Frozen, only
    the worker being timed (and the idle parent) is left to run.
    """

    def __init__(self, spec: CandidateSpec) -> None:
        self.spec = spec
        self.info: WorkerInfo | None = None
        self.source: str | None = None
        self.gflop: float | None = None
        self._point, self._count_flops = "", False
        self._stopped = False
        ours, theirs = socket.socketpair()
        self._conn = Connection(ours.detach())
        # TVM's pool would pin the thread that configures it to one core unless TVM_BIND_THREADS=0
        env = dict(os.environ, TVM_BIND_THREADS=os.environ.get("TVM_BIND_THREADS", "0"))
        try:
            self._process = subprocess.Popen([sys.executable, "-c", WORKER_CODE, str(theirs.fileno()),
                                              str(os.getpid())],
                                             pass_fds=[theirs.fileno()], env=env, stdin=subprocess.DEVNULL,
                                             start_new_session=True)
        except BaseException:
            self._conn.close()
            raise
        finally:
            theirs.close()  # only the worker holds its end: its death reads as EOF here
        send(self._conn, (spec, list(sys.path)))

    @property
    def pid(self) -> int:
        return self._process.pid

    def opened(self) -> WorkerInfo:
        """Wait until the worker has opened its candidate; CandidateFailed with the reason when it could not."""
        kind, payload = self._reply(OPEN_TIMEOUT_S)
        if kind != "ready":
            raise CandidateFailed(str(payload))
        self.source = payload["source"]
        self.info = WorkerInfo(pid=payload["pid"], threads=payload["threads"], backend=payload["backend"])
        self.freeze()
        return self.info

    def at(self, point: str, count_flops: bool) -> None:
        self._point, self._count_flops, self.gflop = point, count_flops, None

    def warm(self) -> float:
        _, first_ms, self.gflop, cores = self._request(("shape", self._point, self._count_flops), OPEN_TIMEOUT_S)
        if self.info is not None:
            self.info.cores = cores
        return float(first_ms)

    def block(self, timed: int) -> np.ndarray:
        return self._request(("block", timed), BLOCK_TIMEOUT_S)[1]

    def _request(self, message: tuple[Any, ...], timeout_s: float) -> tuple[Any, ...]:
        self._signal(SIGCONT)
        send(self._conn, message)  # a dead worker is told apart by _reply
        reply = self._reply(timeout_s)
        self.freeze()
        if reply[0] == "error":
            raise CandidateFailed(reply[1])
        return reply

    def freeze(self) -> None:
        """Stop every thread of the worker (and of any child it started) until its next request."""
        if not self._stopped:
            self._signal(SIGSTOP)

    def _signal(self, signum: int | None) -> None:
        if signum is not None and self._process.poll() is None:
            try:
                os.killpg(self._process.pid, signum)  # the worker leads its own process group
            except (ProcessLookupError, PermissionError):
                pass

    def _reply(self, timeout_s: float) -> tuple[Any, ...]:
        if not wait([self._conn], timeout_s):
            self.stop()
            raise CandidateFailed(f"worker gave no reply within {timeout_s:g} s (stopped)")
        try:
            return self._conn.recv()
        except EOFError:  # the worker is gone: say how
            self.stop()
            raise CandidateFailed(exit_reason(self._process.returncode)) from None

    def ask_exit(self) -> None:
        if not self._stopped and self._process.poll() is None:
            self._signal(SIGCONT)
            send(self._conn, ("exit",))

    def stop(self, timeout_s: float = EXIT_TIMEOUT_S) -> None:
        """Ask the worker to exit; terminate, then kill, one that does not. Safe to call twice."""
        if self._stopped:
            return
        self.ask_exit()
        try:
            self._process.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self._process.terminate()
            try:
                self._process.wait(EXIT_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
        self._conn.close()
        self._stopped = True


def stop_all(workers: Sequence[Worker]) -> None:
    """Every worker gets "exit" first, so they wind down together, then each is reaped (or terminated)."""
    for worker in workers:
        worker.ask_exit()
    for worker in workers:
        worker.stop()


def time_interleaved(runners: dict[str, BlockRunner], budget_s: float, min_rounds: int = MIN_ROUNDS,
                     max_rounds: int = MAX_ROUNDS, seed: int | Sequence[int] = 0
                     ) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, str]]:
    """Warm every runner, then rounds of one block per runner (order shuffled each round) for `budget_s`; ns samples.

    Shuffled, not rotated: a rotation keeps each runner's predecessor fixed, and the predecessor's cache and
    thread-pool state bias the next runner, so two identical sessions read apart. `seed` fixes the order; runs
    meant to be independent need seeds of their own, or they repeat each round's order and with it each
    candidate's predecessors.

    Rounds go on until the budget is spent, at least `min_rounds` and at most `max_rounds`. A block is
    BLOCK_CALLS back-to-back calls, its first untimed (it absorbs the wake-up and the previous candidate's
    thread pools still spinning). Returns samples, first-call ms and failures: a runner that raises is
    dropped with its reason (CandidateFailed's message, else 'Type: first line') and the others go on.
    """
    first_ms: dict[str, float] = {}
    failures: dict[str, str] = {}

    def fail(name: str, exc: Exception) -> None:
        failures[name] = str(exc) if isinstance(exc, CandidateFailed) else describe_exception(exc)

    for name, runner in runners.items():
        try:
            first_ms[name] = runner.warm()
        except Exception as exc:  # noqa: BLE001 -- a baseline may fail here (e.g. torch.compile without a compiler)
            fail(name, exc)
    timed = BLOCK_CALLS - 1
    live = [name for name in runners if name not in failures]
    samples: dict[str, list[np.ndarray]] = {name: [] for name in live}
    deadline = time.perf_counter() + budget_s
    rounds = 0
    order = np.random.default_rng(seed)
    while live and rounds < max_rounds and (rounds < min_rounds or time.perf_counter() < deadline):
        for name in [live[i] for i in order.permutation(len(live))]:
            try:
                samples[name].append(np.asarray(runners[name].block(timed), dtype=np.int64))
            except Exception as exc:  # noqa: BLE001 -- a candidate failing mid-run is dropped with its reason, as at warm-up
                fail(name, exc)
        live = [name for name in live if name not in failures]
        rounds += 1
    return ({name: np.concatenate(samples[name]) if samples[name] else np.empty(0, dtype=np.int64) for name in live},
            {name: first_ms[name] for name in live}, failures)


def flop_counter(workers: list[Worker]) -> Worker | None:
    """Who counts FLOPs: the eager module, else the TorchScript one (FlopCounterMode needs a torch module)."""
    for kind in ("eager", "torchscript module"):
        for worker in workers:
            if worker.spec.kind == kind:
                return worker
    return None


def bench_network(model_dir: Path, manifest: Manifest, network: str, recipe: Path | None, budget_s: float,
                  progress: Callable[[str], None], torch_compile: bool = True, cores: int = 0,
                  extra_candidates: Sequence[CandidateSpec] = (), rounds: int | None = None,
                  protocol: bool = False, count_flops: bool = True, seed: Sequence[int] = (0,)) -> NetworkBench:
    record = manifest.network(network, model_dir)
    reference = load_reference(model_dir, record)
    skipped: list[Skip] = []
    specs = candidate_specs(model_dir, manifest, network, recipe, torch_compile, cores or usable_cores(), skipped,
                            protocol)
    specs += list(extra_candidates)
    notes = {spec.name: spec.note for spec in specs}
    progress(f"{network}: opening {len(specs)} candidates, one process each")
    workers: list[Worker] = []
    infos: dict[str, WorkerInfo] = {}
    eager_source = None
    shapes: list[ShapeBench] = []
    live: list[Worker] = []
    try:
        for spec in specs:  # all start at once: they import and open in parallel
            workers.append(Worker(spec))
        for worker in workers:
            name = worker.spec.name
            try:
                info = worker.opened()
            except CandidateFailed as exc:
                skipped.append(Skip(candidate=name, reason=str(exc)))
                worker.stop()
                continue
            live.append(worker)
            infos[name] = info
            if worker.spec.kind == "eager":
                eager_source = worker.source
                notes[name] = f"the nn.Module from {worker.source}"
            if worker.spec.backend == "auto" and info.backend not in (None, "auto"):
                notes[name] += f" (resolved to {info.backend})"
        for index, point in enumerate(profile_points(reference)):
            shape = reference.shape(point)
            progress(f"{network}: {point} {shape}: {len(live)} candidates, "
                     + (f"{rounds} rounds" if rounds else f"~{budget_s:g} s"))
            counter = flop_counter(live) if count_flops else None
            for worker in live:
                worker.at(point, worker is counter)
            bounds = {"min_rounds": rounds, "max_rounds": rounds} if rounds else {}
            samples, first_ms, failures = time_interleaved({w.spec.name: w for w in live}, budget_s, **bounds,
                                                           seed=[*seed, index])
            for worker in [w for w in live if w.spec.name in failures]:
                skipped.append(Skip(candidate=worker.spec.name,
                                    reason=f"failed at {point} {shape}: {failures[worker.spec.name]}"))
                worker.stop()
            live = [w for w in live if w.spec.name not in failures]
            gflop = counter.gflop if counter in live else None
            results, ort_best = shape_results(samples, first_ms, [(w.spec.name, w.spec.group) for w in live], gflop,
                                              {w.spec.name for w in live if is_yardstick(w.spec)})
            shapes.append(ShapeBench(point=point, shape=shape, gflop=gflop, rounds=rounds_of(samples, BLOCK_CALLS - 1),
                                     ort_best=ort_best, results=results,
                                     round_medians_us=round_medians_us(samples, BLOCK_CALLS - 1)))
    finally:
        stop_all(workers)
    return NetworkBench(network=network, eager_source=eager_source, candidates={w.spec.name: notes[w.spec.name]
                        for w in live}, skipped=skipped, shapes=shapes, workers=infos)


def run_bench(model_dir: Path | str, network: str | None = None, recipe: Path | str | None = None, *,
              budget_s: float = DEFAULT_BUDGET_S, progress: Callable[[str], None] | None = None,
              torch_compile: bool = True, extra_candidates: Sequence[CandidateSpec] = (),
              rounds: int | None = None, protocol: bool = False, count_flops: bool = True,
              seed: int | None = None) -> BenchReport:
    """Bench one network (or all) of a MODEL_DIR; see the module docstring for what is compared and how.

    `torch_compile=False` leaves torch.compile out (its first compile takes many seconds); tests use it.
    `extra_candidates` are benched beside the built-in ones, for every network (tests inject failing ones).
    `rounds`: exactly that many interleaved rounds per shape instead of a time budget. `protocol`: the
    candidate set scripts/bench.py's protocol reads (candidates.candidate_specs). `count_flops=False` leaves
    GFLOP and GFLOP/s out: torch's FlopCounterMode imports torch._dynamo on first use (about 2 s). `seed` orders
    the rounds (default: a new one, recorded in the report, so two runs are independent and one can be replayed).
    """
    from rlopt.backends import tool_versions

    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    if network is not None:
        manifest.network(network, model_dir)
    if recipe is not None:
        check_recipe(model_dir, manifest, Path(recipe))
    if rounds is not None and rounds < 1:
        raise UsageError(f"rounds {rounds}: must be >= 1 interleaved rounds per shape; fix: e.g. 30")
    if not budget_s > 0:
        raise UsageError(f"--budget {budget_s}: must be > 0 seconds per shape; fix: e.g. --budget 2")
    seed = secrets.randbits(31) if seed is None else int(seed)
    cores = usable_core_ids()
    load_start = load_average()
    names = [network] if network else list(manifest.networks)
    results = [bench_network(model_dir, manifest, name, Path(recipe) if recipe else None, budget_s,
                             progress or (lambda _: None), torch_compile, len(cores), extra_candidates, rounds,
                             protocol, count_flops, (seed, number))
               for number, name in enumerate(names)]
    threads = {"usable_cores": len(cores), "torch_threads": torch_threads(results)}
    machine = machine_facts() | {"threads": threads, "load_average_start": load_start,
                                 "load_average_end": load_average()}
    return BenchReport(created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), model_dir=str(model_dir),
                       budget_s=budget_s, method=METHOD, seed=seed, machine=machine, versions=tool_versions(),
                       networks=results,
                       warnings=affinity_warnings(results, cores))


__all__ = [
    "BLOCK_CALLS",
    "DEFAULT_BUDGET_S",
    "METHOD",
    "WARMUP_CALLS",
    "BlockRunner",
    "CandidateFailed",
    "Worker",
    "bench_network",
    "run_bench",
    "time_interleaved",
]
