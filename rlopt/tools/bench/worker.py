"""The bench worker process: opens one candidate and serves timed blocks of calls to the parent (see driver).

A fresh interpreter (`python -c WORKER_CODE`), started by `driver.Worker`; it talks to the parent over
one pipe, one request at a time, and dies with the parent (PR_SET_PDEATHSIG). For a recurrent network
(`state` pairs in reference.npz) the worker is one simulated actor per shape: after every call, timed or
not, the output state is copied into the input state the candidate's call reads (untimed).
"""

from __future__ import annotations

import os
import signal
import sys
import time
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rlopt.backends.base import flatten_outputs
from rlopt.errors import RloptError, describe_exception
from rlopt.manifest import read_manifest
from rlopt.reference import Reference
from rlopt.machine import usable_core_ids
from rlopt.tools.bench.candidates import OPENERS, Call, CandidateSpec, OpenCandidate, count_gflop, load_reference

WARMUP_CALLS = 5  # untimed calls per candidate and shape before any timed block
BLOCK_CALLS = 8  # calls per block, the first untimed

WORKER_CODE = ("import sys; from rlopt.tools.bench.worker import worker_entry; "
               "worker_entry(int(sys.argv[1]), int(sys.argv[2]))")


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
    # A worker writes no files: skip the interpreter's teardown (torch's alone took ~0.5 s per worker at exit).
    sys.stderr.flush()
    os._exit(0)


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
        send(conn, ("skip", str(exc)))
        return
    except Exception as exc:  # noqa: BLE001 -- a baseline's own library failed to open it
        send(conn, ("skip", f"cannot be opened: {describe_exception(exc)}"))
        return
    try:
        model_dir = Path(spec.model_dir)
        record = read_manifest(model_dir).networks[spec.network]
        reference = load_reference(model_dir, record)
        ready = {"pid": os.getpid(), "threads": opened.threads, "backend": opened.backend, "source": opened.source}
        if send(conn, ("ready", ready)):
            _serve(conn, opened, reference, list(record.inputs), record.outputs)
    finally:
        opened.close()


def state_feedback(feeds: dict[str, np.ndarray], state: dict[str, str], output_names: list[str]
                   ) -> Callable[[object], None]:
    """What a call returned (a dict by output name, or the outputs in order: a list, a tuple, one tensor) -> its
    output state copied into `feeds`, the arrays the candidate's call reads (torch tensors share their memory)."""
    position = {name: i for i, name in enumerate(output_names)}

    def feed_back(result: object) -> None:
        if isinstance(result, dict):
            named = result
        else:
            flat = flatten_outputs(result)
            if len(flat) != len(output_names):
                raise ValueError(f"the call returned {len(flat)} outputs, the network has {len(output_names)}: "
                                 "its recurrent state cannot be fed back")
            named = {name: flat[position[name]] for name in state.values()}
        for state_input, state_output in state.items():
            value = named[state_output]
            np.copyto(feeds[state_input], np.asarray(value.detach() if hasattr(value, "detach") else value),
                      casting="same_kind")

    return feed_back


def _serve(conn: Connection, opened: OpenCandidate, reference: Reference, input_names: list[str],
           output_names: list[str]) -> None:
    clock = time.perf_counter_ns
    call: Call | None = None
    feed_back: Callable[[object], None] | None = None
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
                feeds = {name: np.array(value) for name, value in reference.feeds(point, 0).items()}  # own copies
                gflop = (count_gflop(opened.flop_module, input_names, feeds)
                         if count_flops and opened.flop_module is not None else None)
                call = opened.prepare(feeds)
                feed_back = state_feedback(feeds, reference.state, output_names) if reference.state else None
                start = time.perf_counter()
                result = call()
                first_ms = (time.perf_counter() - start) * 1e3
                for _ in range(WARMUP_CALLS - 1):
                    if feed_back is not None:
                        feed_back(result)
                    result = call()
                if feed_back is not None:
                    feed_back(result)
                reply: tuple[Any, ...] = ("warm", first_ms, gflop, sorted(usable_core_ids()))
            elif request[0] == "block" and call is not None:
                samples = np.empty(int(request[1]), dtype=np.int64)
                result = call()  # untimed: absorbs the wake-up (SIGCONT, pipe read) of this process and its pools
                if feed_back is None:
                    for k in range(samples.size):
                        start_ns = clock()
                        call()
                        samples[k] = clock() - start_ns
                else:
                    feed_back(result)
                    for k in range(samples.size):
                        start_ns = clock()
                        result = call()
                        samples[k] = clock() - start_ns
                        feed_back(result)
                reply = ("block", samples)
            else:
                raise ValueError(f"unexpected request {request[0]!r}")
        except Exception as exc:  # noqa: BLE001 -- the candidate failed at this shape; the parent drops it
            reply = ("error", describe_exception(exc))
        if not send(conn, reply):
            return


def send(conn: Connection, message: tuple[Any, ...]) -> bool:
    """False when the other end is gone (the parent died or gave up on this worker)."""
    try:
        conn.send(message)
    except (BrokenPipeError, EOFError, OSError):
        return False
    return True


__all__ = ["BLOCK_CALLS", "WARMUP_CALLS", "WORKER_CODE", "send", "state_feedback", "worker_entry"]
