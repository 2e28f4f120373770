"""`rlopt bench`: every built backend next to the baselines a user would otherwise pick, per profile shape.

Candidates, per network:
- each backend built, verified and runnable here, through `rlopt.load` (numpy in, numpy out: what
  users call), and `rlopt.load(..., backend="auto")`, which shows what auto gives at each shape;
- PyTorch eager: the model rebuilt from the recipe. A MODEL_DIR does not hold model code, and a
  recipe's file factory is relative to the ORIGINAL recipe, so eager needs `--recipe` (the one
  given to `rlopt compile`); its `model` section must equal MODEL_DIR/recipe.yaml's and the
  rebuilt module must reproduce reference.npz, else eager is skipped with the reason. A factory
  given as an importable module (`pkg.module:callable`) needs no `--recipe`;
- the TorchScript module (model.ts) called directly with torch tensors;
- `torch.compile` of the eager module (inductor; its compile time is reported, not timed);
- ONNX Runtime on the exported model.onnx with ORT_ENABLE_ALL at 1 intra-op thread and at all
  usable cores.
Torch candidates get torch tensors made once per shape (`torch.from_numpy`, no copy), ONNX Runtime
candidates numpy arrays: each is called the way its users call it.

Each candidate lives in its own worker process (a fresh interpreter, not fork: torch, ONNX Runtime and
TVM thread pools do not survive fork), built there from a picklable `CandidateSpec`, with feeds read
there from reference.npz. Users run one backend per process; in one shared process the candidates'
thread pools fought over the cores (TVM at the max shape: 4 ms interleaved, 0.2 ms alone).
Timing stays interleaved round by round (a short block of calls of every candidate per round, the
order shuffled each round, seeded) so machine drift hits all alike: the parent asks one worker at a time for
a block and waits for its timings; the others are frozen (SIGSTOP) meanwhile, since a pipe read
alone leaves their pools spinning for 10-50 ms after a call (see `Worker`). Each
candidate gets WARMUP_CALLS untimed calls first, and each block's first call is untimed (see
`time_interleaved`). A worker that raises or dies is dropped with the reason; the others go on.
Reported: median and p99 of single calls, and median / (best ONNX Runtime median).
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from multiprocessing.connection import Connection, wait
from pathlib import Path
from typing import Any, Callable, Protocol, Sequence

import numpy as np
from pydantic import BaseModel

from rlopt.errors import ArtifactError, BackendUnavailable, RloptError, UsageError, describe_exception, located
from rlopt.lazy import require
from rlopt.machine import machine_facts
from rlopt.manifest import Manifest, NetworkRecord, checked_file, read_manifest
from rlopt.reference import Reference
from rlopt.backends import unavailable_reason

WARMUP_CALLS = 5
BLOCK_CALLS = 8
MIN_ROUNDS = 10
MAX_ROUNDS = 2000
DEFAULT_BUDGET_S = 2.0
OPEN_TIMEOUT_S = 600.0  # a worker imports torch / TVM and opens its candidate; torch.compile compiles on warmup
BLOCK_TIMEOUT_S = 60.0  # one block is a few calls: a worker silent this long is hung
EXIT_TIMEOUT_S = 5.0  # after "exit", before a worker is terminated, then killed

Call = Callable[[], object]


class CandidateResult(BaseModel):
    candidate: str
    group: str
    median_us: float
    p99_us: float
    mean_us: float
    calls: int
    ratio_to_ort_best: float | None
    gflops_per_s: float | None
    first_call_ms: float


class ShapeBench(BaseModel):
    point: str
    shape: dict[str, list[int]]
    gflop: float | None
    rounds: int
    ort_best: str | None
    results: list[CandidateResult]


class Skip(BaseModel):
    candidate: str
    reason: str


class WorkerInfo(BaseModel):
    """The process a candidate ran in: its own pid, the threads it computes with, the cores it may use."""

    pid: int
    threads: int | None = None
    backend: str | None = None  # for rlopt candidates: the backend the Session runs (what `auto` resolved to)
    cores: list[int] = []


class NetworkBench(BaseModel):
    network: str
    eager_source: str | None
    candidates: dict[str, str]
    skipped: list[Skip]
    shapes: list[ShapeBench]
    workers: dict[str, WorkerInfo] = {}


class BenchReport(BaseModel):
    kind: str = "rlopt-bench"
    schema_version: int = 1
    created_at: str
    model_dir: str
    budget_s: float
    method: str
    isolation: str = "process"
    machine: dict[str, Any]
    versions: dict[str, str | None]
    networks: list[NetworkBench]
    warnings: list[str] = []


METHOD = ("each candidate in its own worker process (a fresh interpreter), the parent driving interleaved rounds: "
          f"per round each worker in turn runs a block of {BLOCK_CALLS} back-to-back calls, the first untimed, "
          "while the others are frozen (SIGSTOP); order shuffled each round (seeded); "
          f"{WARMUP_CALLS} untimed warmup calls per candidate and shape first; median and p99 of single calls; "
          "ratio = median / best ONNX Runtime median at that shape")


@dataclass(frozen=True)
class CandidateSpec:
    """What a worker builds, picklable: `kind` picks the opener (see OPENERS), the rest are its arguments.

    kind "factory" calls `factory` ("module:function", taking the spec and returning an OpenCandidate): a way
    to bench something rlopt does not know (tests use it for a candidate that crashes its process).
    """

    name: str
    group: str
    note: str
    kind: str
    model_dir: str
    network: str
    backend: str | None = None
    threads: int | None = None
    recipe: str | None = None
    factory: str | None = None


@dataclass
class OpenCandidate:
    """A candidate opened in its worker: `prepare(feeds)` returns a zero-argument call bound to those inputs."""

    prepare: Callable[[dict[str, np.ndarray]], Call]
    close: Callable[[], None] = lambda: None
    threads: int | None = None
    backend: str | None = None
    flop_module: Any = None  # a torch module FlopCounterMode can count
    source: str | None = None  # where the eager module came from


def usable_cores() -> int:
    """Cores this thread may run on (not os.cpu_count(): a container or a pinned thread has fewer)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ----------------------------------------------------------------------------------------------------------------
# Candidates: which to run (in the parent, from the manifest alone) ...


def candidate_specs(model_dir: Path, manifest: Manifest, network: str, recipe: Path | None, torch_compile: bool,
                    cores: int, skipped: list[Skip]) -> list[CandidateSpec]:
    """Every candidate for `network`; those the manifest already rules out go to `skipped` with the reason."""
    record = manifest.networks[network]
    common = {"model_dir": str(model_dir), "network": network, "recipe": str(recipe) if recipe else None}
    specs = []
    for backend, artifact in record.artifacts.items():
        label = f"rlopt {backend}"
        if artifact.skipped:
            skipped.append(Skip(candidate=label, reason=artifact.skipped))
            continue
        if not artifact.verified:
            skipped.append(Skip(candidate=label, reason="failed verification at compile time"))
            continue
        reason = unavailable_reason(backend, artifact.facts)
        if reason is not None:
            skipped.append(Skip(candidate=label, reason=reason))
            continue
        selected = " (selected by auto)" if backend == record.selected else ""
        specs.append(CandidateSpec(label, "rlopt", f"rlopt.load(..., backend='{backend}').run{selected}", "rlopt",
                                   backend=backend, **common))
    specs.append(CandidateSpec("rlopt auto", "rlopt", "rlopt.load(..., backend='auto').run", "rlopt",
                               backend="auto", **common))
    specs.append(CandidateSpec("pytorch eager", "baseline", "the nn.Module from the recipe", "eager", **common))
    if "model.ts" in record.files:
        specs.append(CandidateSpec("torchscript module", "baseline", "torch.jit.load(model.ts), torch tensors",
                                   "torchscript", **common))
    else:
        skipped.append(Skip(candidate="torchscript module", reason="manifest.json lists no model.ts"))
    if torch_compile:
        specs.append(CandidateSpec("torch.compile", "baseline", "torch.compile(eager) (inductor, default mode)",
                                   "torch.compile", **common))
    else:
        skipped.append(Skip(candidate="torch.compile", reason="not requested"))
    if "model.onnx" not in record.files:
        skipped.append(Skip(candidate="onnxruntime", reason="manifest.json lists no model.onnx"))
        return specs
    for threads in sorted({1, cores}):
        label = f"onnxruntime {threads} thread" + ("s" if threads > 1 else "")
        specs.append(CandidateSpec(label, "baseline", f"model.onnx, ORT_ENABLE_ALL, intra_op_num_threads={threads}",
                                   "onnxruntime", threads=threads, **common))
    return specs


def check_recipe(model_dir: Path, manifest: Manifest, recipe: Path) -> None:
    """--recipe must be the recipe MODEL_DIR was compiled from: same `model` section (factory, kwargs, weights)."""
    from rlopt.recipe import load_recipe

    if not recipe.is_file():
        raise UsageError(located(recipe, "--recipe", "recipe not found", "give the recipe passed to 'rlopt compile'"))
    stored_path = checked_file(model_dir, manifest.recipe)
    if load_recipe(recipe).model != load_recipe(stored_path).model:
        raise UsageError(located(recipe, "model", f"differs from the model MODEL_DIR was compiled from "
                                 f"({stored_path})", "pass the recipe given to 'rlopt compile'"))


# ----------------------------------------------------------------------------------------------------------------
# ... and how a worker opens each one


def _torch_call(module: Any, input_names: list[str]) -> Callable[[dict[str, np.ndarray]], Call]:
    torch = require("torch")

    def prepare(feeds: dict[str, np.ndarray]) -> Call:
        tensors = [torch.from_numpy(feeds[name]) for name in input_names]

        def call() -> object:
            with torch.inference_mode():
                return module(*tensors)

        return call

    return prepare


def eager_module(model_dir: Path, manifest: Manifest, network: str, recipe: Path | None) -> tuple[Any, str]:
    """The eager PyTorch network and where it came from; raises BackendUnavailable with the reason when it cannot."""
    from rlopt.recipe import load_recipe
    from rlopt.stages.load_model import build_model, submodule

    stored_path = checked_file(model_dir, manifest.recipe)
    stored = load_recipe(stored_path)
    if recipe is not None:
        check_recipe(model_dir, manifest, recipe)
        source_path, source = Path(recipe), f"recipe {recipe}"
    else:
        target = stored.model.factory.rpartition(":")[0]
        if target.endswith(".py") or "/" in target or stored.model.checkpoint:
            raise BackendUnavailable(
                f"needs the model code: the factory '{stored.model.factory}'"
                + (" and checkpoint are" if stored.model.checkpoint else " is")
                + " relative to the original recipe; pass --recipe RECIPE")
        source_path, source = stored_path, f"importable factory {stored.model.factory}"
    try:
        model, _ = build_model(stored.model, source_path)
    except RloptError as exc:
        raise BackendUnavailable(f"cannot rebuild the model from {source}: {exc}") from None
    module = submodule(model, manifest.networks[network].module, source_path, network)
    return module, source


def _check_eager(module: Any, record: NetworkRecord, reference: Reference) -> None:
    """The rebuilt module must reproduce the recorded outputs, or it is not the model that was compiled."""
    from rlopt.verify import check_parity, tolerance_of

    torch = require("torch")
    names = list(record.inputs)

    def infer(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            result = module(*[torch.from_numpy(feeds[n]) for n in names])
        flat = list(result) if isinstance(result, (tuple, list)) else [result]
        return [t.detach().numpy() for t in flat]

    parity = check_parity(infer, reference, record.kind, record.distribution, tolerance_of(record))
    if not parity.passed:
        raise BackendUnavailable(f"the rebuilt model does not reproduce reference.npz (max_abs {parity.max_abs:.2e}): "
                                 "its code or weights changed since compile")


def _checked_eager(spec: CandidateSpec) -> tuple[Any, str, list[str]]:
    """The eager module, checked against reference.npz, its source and input names (for eager and torch.compile)."""
    model_dir = Path(spec.model_dir)
    manifest = read_manifest(model_dir)
    record = manifest.networks[spec.network]
    module, source = eager_module(model_dir, manifest, spec.network, Path(spec.recipe) if spec.recipe else None)
    _check_eager(module, record, load_reference(model_dir, record))
    return module, source, list(record.inputs)


def _open_eager(spec: CandidateSpec) -> OpenCandidate:
    module, source, names = _checked_eager(spec)
    return OpenCandidate(_torch_call(module, names), threads=require("torch").get_num_threads(), flop_module=module,
                         source=source)


def _open_torch_compile(spec: CandidateSpec) -> OpenCandidate:
    torch = require("torch")
    try:
        module, source, names = _checked_eager(spec)
    except BackendUnavailable as exc:
        raise BackendUnavailable(f"needs the eager model (see pytorch eager): {exc}") from None
    compiled = torch.compile(module)
    return OpenCandidate(_torch_call(compiled, names), lambda: torch._dynamo.reset(), torch.get_num_threads(),
                         source=source)


def _open_torchscript(spec: CandidateSpec) -> OpenCandidate:
    torch = require("torch")
    model_dir = Path(spec.model_dir)
    record = read_manifest(model_dir).networks[spec.network]
    scripted = torch.jit.load(str(checked_file(model_dir, record.files["model.ts"])), map_location="cpu").eval()
    return OpenCandidate(_torch_call(scripted, list(record.inputs)), threads=torch.get_num_threads(),
                         flop_module=scripted)


def _open_onnxruntime(spec: CandidateSpec) -> OpenCandidate:
    ort = require("onnxruntime")
    model_dir = Path(spec.model_dir)
    record = read_manifest(model_dir).networks[spec.network]
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    options.intra_op_num_threads = int(spec.threads or 1)
    options.inter_op_num_threads = 1
    options.log_severity_level = 3
    session = ort.InferenceSession(str(checked_file(model_dir, record.files["model.onnx"])), sess_options=options,
                                   providers=["CPUExecutionProvider"])

    def prepare(feeds: dict[str, np.ndarray]) -> Call:
        return lambda: session.run(None, feeds)

    return OpenCandidate(prepare, threads=spec.threads)


def _open_rlopt(spec: CandidateSpec) -> OpenCandidate:
    import rlopt

    try:
        session = rlopt.load(spec.model_dir, spec.network, spec.backend or "auto")
    except (ArtifactError, BackendUnavailable) as exc:  # one broken backend must not hide the others' figures
        raise BackendUnavailable(f"cannot be loaded: {exc}") from None
    backend = str(getattr(session, "backend", spec.backend))
    return OpenCandidate(lambda feeds: (lambda: session.run(feeds)), session.close,
                         _backend_threads(Path(spec.model_dir), spec.network, backend), backend)


def _backend_threads(model_dir: Path, network: str, backend: str) -> int | None:
    """The threads an rlopt backend computes with, where it can be told from outside (None: not known)."""
    if backend == "tvm" and os.environ.get("TVM_NUM_THREADS", "").isdigit():
        return int(os.environ["TVM_NUM_THREADS"])  # set by the TVM runner before its pool starts
    if backend == "torchscript":
        return int(require("torch").get_num_threads())
    if backend == "onnxruntime":
        artifact = read_manifest(model_dir).networks[network].artifacts.get(backend)
        threads = artifact.facts.get("intra_op_threads") if artifact else None
        return int(threads) if threads else usable_cores()
    return None


def _open_factory(spec: CandidateSpec) -> OpenCandidate:
    module_name, _, function = (spec.factory or "").partition(":")
    opened = getattr(importlib.import_module(module_name), function)(spec)
    if not isinstance(opened, OpenCandidate):
        raise TypeError(f"{spec.factory} returned {type(opened).__name__}, not an OpenCandidate")
    return opened


OPENERS: dict[str, Callable[[CandidateSpec], OpenCandidate]] = {
    "rlopt": _open_rlopt, "eager": _open_eager, "torch.compile": _open_torch_compile,
    "torchscript": _open_torchscript, "onnxruntime": _open_onnxruntime, "factory": _open_factory}


def load_reference(model_dir: Path, record: NetworkRecord) -> Reference:
    return Reference.load(checked_file(model_dir, record.reference), list(record.inputs), record.outputs)


def count_gflop(module: Any, input_names: list[str], feeds: dict[str, np.ndarray]) -> float | None:
    """FLOPs of one call (torch's FlopCounterMode: matmul / conv families), in GFLOP; None when it cannot tell."""
    torch = require("torch")
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False) as counter, torch.inference_mode():
            module(*[torch.from_numpy(feeds[n]) for n in input_names])
    except Exception:  # counting is a nicety; any failure just means "unknown"
        return None
    total = counter.get_total_flops()
    return total / 1e9 if total else None


# ----------------------------------------------------------------------------------------------------------------
# The worker process


WORKER_CODE = "import sys; from rlopt.bench import worker_entry; worker_entry(int(sys.argv[1]), int(sys.argv[2]))"


def worker_entry(fd: int, parent_pid: int) -> None:
    """A worker process's `python -c` entry: `fd` is its end of the pipe; the first message is (spec, sys.path)."""
    _die_with_parent(parent_pid)
    conn = Connection(fd)
    try:
        os.dup2(2, 1)  # stdout belongs to the parent (`rlopt bench --json`): a library's prints go to stderr
    except OSError:
        pass
    try:
        spec, parent_path = conn.recv()
    except EOFError:
        return
    sys.path.extend(p for p in parent_path if p not in sys.path)  # a "factory" module importable in the parent
    _worker_main(conn, spec)


def _die_with_parent(parent_pid: int) -> None:
    """A frozen worker (SIGSTOP, see Worker) cannot read the EOF a dead parent leaves: have Linux kill it then."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    pr_set_pdeathsig = 1
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGKILL)
    except (OSError, AttributeError):
        return
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)


def _worker_main(conn: Connection, spec: CandidateSpec) -> None:
    """A worker's life: open the candidate, say "ready" (or "skip" with the reason), then serve requests until "exit".

    Requests, one at a time: ("shape", point, count_flops) -> ("warm", first_call_ms, gflop, cores);
    ("block", timed) -> ("block", ns per timed call); an exception in a request -> ("error", reason).
    """
    try:
        opened = OPENERS[spec.kind](spec)
    except RloptError as exc:  # BackendUnavailable, ArtifactError, ...: already a one-line reason
        _send(conn, ("skip", str(exc)))
        return
    except Exception as exc:  # a baseline's own library failed to open it
        _send(conn, ("skip", f"cannot be opened: {describe_exception(exc)}"))
        return
    try:
        model_dir = Path(spec.model_dir)
        record = read_manifest(model_dir).networks[spec.network]
        reference = load_reference(model_dir, record)
        ready = {"pid": os.getpid(), "threads": opened.threads, "backend": opened.backend, "source": opened.source}
        if _send(conn, ("ready", ready)):
            _serve(conn, opened, reference, list(record.inputs))
    finally:
        opened.close()


def _serve(conn: Connection, opened: OpenCandidate, reference: Reference, input_names: list[str]) -> None:
    clock = time.perf_counter_ns
    call: Call | None = None
    while True:
        try:
            request = conn.recv()  # between requests the parent also freezes this process (see Worker)
        except EOFError:  # the parent is gone
            return
        try:
            if request[0] == "exit":
                return
            if request[0] == "shape":
                _, point, count_flops = request
                feeds = reference.feeds(point, 0)
                gflop = (count_gflop(opened.flop_module, input_names, feeds)
                         if count_flops and opened.flop_module is not None else None)
                call = opened.prepare(feeds)
                start = time.perf_counter()
                call()
                first_ms = (time.perf_counter() - start) * 1e3
                for _ in range(WARMUP_CALLS - 1):
                    call()
                reply: tuple[Any, ...] = ("warm", first_ms, gflop, sorted(_affinity()))
            elif request[0] == "block" and call is not None:
                samples = np.empty(int(request[1]), dtype=np.int64)
                call()  # untimed: absorbs the wake-up (SIGCONT, pipe read) of this process and its thread pools
                for k in range(samples.size):
                    start_ns = clock()
                    call()
                    samples[k] = clock() - start_ns
                reply = ("block", samples)
            else:
                raise ValueError(f"unexpected request {request[0]!r}")
        except Exception as exc:  # the candidate failed at this shape; the parent drops it
            reply = ("error", describe_exception(exc))
        if not _send(conn, reply):
            return


def _send(conn: Connection, message: tuple[Any, ...]) -> bool:
    """False when the other end is gone (the parent died or gave up on this worker)."""
    try:
        conn.send(message)
    except (BrokenPipeError, EOFError, OSError):
        return False
    return True


# ----------------------------------------------------------------------------------------------------------------
# The parent's side


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
        _send(self._conn, (spec, list(sys.path)))

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
        _send(self._conn, message)  # a dead worker is told apart by _reply
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
            _send(self._conn, ("exit",))

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
                     max_rounds: int = MAX_ROUNDS) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, str]]:
    """Warm every runner, then rounds of one block per runner (order shuffled each round) for `budget_s`; ns samples.

    Shuffled, not rotated: a rotation keeps each runner's predecessor fixed, and on 2 cores the predecessor's
    cache and pool state biased the next runner (two identical TVM sessions: 390 vs 234 us at the default
    policy's max shape when rotated, 223 vs 220 us shuffled).

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
        except Exception as exc:  # a baseline may fail here (e.g. torch.compile without a compiler)
            fail(name, exc)
    timed = BLOCK_CALLS - 1
    live = [name for name in runners if name not in failures]
    samples: dict[str, list[np.ndarray]] = {name: [] for name in live}
    deadline = time.perf_counter() + budget_s
    rounds = 0
    order = np.random.default_rng(0)
    while live and rounds < max_rounds and (rounds < min_rounds or time.perf_counter() < deadline):
        for name in [live[i] for i in order.permutation(len(live))]:
            try:
                samples[name].append(np.asarray(runners[name].block(timed), dtype=np.int64))
            except Exception as exc:
                fail(name, exc)
        live = [name for name in live if name not in failures]
        rounds += 1
    return ({name: np.concatenate(samples[name]) if samples[name] else np.empty(0, dtype=np.int64) for name in live},
            {name: first_ms[name] for name in live}, failures)


def _profile_points(reference: Reference) -> list[str]:
    return [p for p in reference.points if reference.samples(p) > 0]


def _flop_counter(workers: list[Worker]) -> Worker | None:
    """Who counts FLOPs: the eager module, else the TorchScript one (FlopCounterMode needs a torch module)."""
    for kind in ("eager", "torchscript"):
        for worker in workers:
            if worker.spec.kind == kind:
                return worker
    return None


def _shape_results(samples: dict[str, np.ndarray], first_ms: dict[str, float], workers: list[Worker],
                   gflop: float | None) -> tuple[list[CandidateResult], str | None]:
    medians = {n: float(np.median(s)) / 1e3 for n, s in samples.items() if s.size}
    ort = {n: m for n, m in medians.items() if "onnxruntime" in n}
    ort_best = min(ort, key=ort.__getitem__) if ort else None
    results = []
    for worker in workers:
        name = worker.spec.name
        s = samples.get(name)
        if s is None or not s.size:
            continue
        us = s / 1e3
        median = medians[name]
        results.append(CandidateResult(
            candidate=name, group=worker.spec.group, median_us=round(median, 2),
            p99_us=round(float(np.percentile(us, 99)), 2), mean_us=round(float(us.mean()), 2), calls=int(s.size),
            ratio_to_ort_best=round(median / ort[ort_best], 3) if ort_best else None,
            gflops_per_s=round(gflop / (median * 1e-6), 2) if gflop else None,
            first_call_ms=round(first_ms[name], 3)))
    results.sort(key=lambda r: r.median_us)
    return results, ort_best


def bench_network(model_dir: Path, manifest: Manifest, network: str, recipe: Path | None, budget_s: float,
                  progress: Callable[[str], None], torch_compile: bool = True, cores: int = 0,
                  extra_candidates: Sequence[CandidateSpec] = ()) -> NetworkBench:
    record = manifest.network(network, model_dir)
    reference = load_reference(model_dir, record)
    skipped: list[Skip] = []
    specs = candidate_specs(model_dir, manifest, network, recipe, torch_compile, cores or usable_cores(), skipped)
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
        for point in _profile_points(reference):
            shape = reference.shape(point)
            progress(f"{network}: {point} {shape}: {len(live)} candidates, ~{budget_s:g} s")
            counter = _flop_counter(live)
            for worker in live:
                worker.at(point, worker is counter)
            samples, first_ms, failures = time_interleaved({w.spec.name: w for w in live}, budget_s)
            for worker in [w for w in live if w.spec.name in failures]:
                skipped.append(Skip(candidate=worker.spec.name,
                                    reason=f"failed at {point} {shape}: {failures[worker.spec.name]}"))
                worker.stop()
            live = [w for w in live if w.spec.name not in failures]
            gflop = counter.gflop if counter in live else None
            results, ort_best = _shape_results(samples, first_ms, live, gflop)
            rounds = min(s.size for s in samples.values()) // (BLOCK_CALLS - 1) if samples else 0
            shapes.append(ShapeBench(point=point, shape=shape, gflop=gflop, rounds=rounds, ort_best=ort_best,
                                     results=results))
    finally:
        stop_all(workers)
    return NetworkBench(network=network, eager_source=eager_source, candidates={w.spec.name: notes[w.spec.name]
                        for w in live}, skipped=skipped, shapes=shapes, workers=infos)


def run_bench(model_dir: Path | str, network: str | None = None, recipe: Path | str | None = None, *,
              budget_s: float = DEFAULT_BUDGET_S, progress: Callable[[str], None] | None = None,
              torch_compile: bool = True, extra_candidates: Sequence[CandidateSpec] = ()) -> BenchReport:
    """Bench one network (or all) of a MODEL_DIR; see the module docstring for what is compared and how.

    `torch_compile=False` leaves torch.compile out (its first compile takes many seconds); tests use it.
    `extra_candidates` are benched beside the built-in ones, for every network (tests inject failing ones).
    """
    from rlopt.compile import tool_versions

    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    if network is not None:
        manifest.network(network, model_dir)
    if recipe is not None:
        check_recipe(model_dir, manifest, Path(recipe))
    if not budget_s > 0:
        raise UsageError(f"--budget {budget_s}: must be > 0 seconds per shape; fix: e.g. --budget 2")
    affinity = _affinity()
    load_start = _load_average()
    names = [network] if network else list(manifest.networks)
    results = [bench_network(model_dir, manifest, name, Path(recipe) if recipe else None, budget_s,
                             progress or (lambda _: None), torch_compile, len(affinity), extra_candidates)
               for name in names]
    warnings = [f"{net.network} / {name}: its process's CPU affinity was cores {info.cores} after warmup, not "
                f"{sorted(affinity)}: a runtime pinned it (TVM does so when its thread pool is configured unless "
                "TVM_BIND_THREADS=0), so it ran on fewer cores"
                for net in results for name, info in net.workers.items() if info.cores and set(info.cores) != affinity]
    torch_threads = next((info.threads for net in results for name, info in net.workers.items()
                          if name in ("pytorch eager", "torchscript module")), None)
    threads = {"usable_cores": len(affinity), "torch_threads": torch_threads}
    machine = machine_facts() | {"threads": threads, "load_average_start": load_start,
                                 "load_average_end": _load_average()}
    return BenchReport(created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), model_dir=str(model_dir),
                       budget_s=budget_s, method=METHOD, machine=machine, versions=tool_versions(), networks=results,
                       warnings=warnings)


def _load_average() -> list[float] | None:
    """1/5/15-minute load averages: a bench on a busy machine says so."""
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _affinity() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


# ----------------------------------------------------------------------------------------------------------------
# Rendering


def _us(value: float) -> str:
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} us"


def bench_tables(report: BenchReport) -> list[Any]:
    """One rich table per network: shape x candidate, fastest first."""
    from rich.markup import escape
    from rich.table import Table

    tables = []
    for net in report.networks:
        table = Table(title=f"{net.network}: median / p99 per call, x = median / best ONNX Runtime median")
        for column in ("shape", "candidate", "median", "p99", "x ORT best", "GFLOP/s", "first call"):
            table.add_column(column, justify="right", overflow="fold")
        for shape in net.shapes:
            label = f"{shape.point} " + " ".join("x".join(map(str, d)) for d in shape.shape.values())
            for i, r in enumerate(shape.results):
                ratio = "-" if r.ratio_to_ort_best is None else f"{r.ratio_to_ort_best:.2f}"
                style = "bold green" if i == 0 else ""
                table.add_row(label if i == 0 else "", f"[{style}]{r.candidate}[/]" if style else r.candidate,
                              _us(r.median_us), _us(r.p99_us), ratio,
                              "-" if r.gflops_per_s is None else f"{r.gflops_per_s:.1f}", f"{r.first_call_ms:.1f} ms")
            table.add_section()
        rounds = sorted({shape.rounds for shape in net.shapes})
        notes = [f"{skip.candidate}: {skip.reason}" for skip in net.skipped]
        table.caption = escape(f"{'/'.join(map(str, rounds)) or 0} interleaved rounds per shape, each candidate "
                               "in its own process; "
                               + ("not run: " + "; ".join(notes) if notes else "every candidate ran"))
        tables.append(table)
    if tables and report.warnings:
        tables[-1].caption += escape("; WARNING: " + "; ".join(report.warnings))
    return tables


__all__ = ["run_bench", "BenchReport", "bench_tables", "time_interleaved", "CandidateSpec", "OpenCandidate"]
