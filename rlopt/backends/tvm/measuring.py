"""Where MetaSchedule builds and measures candidates during a tune: the builder (exports kept in the tune's scratch
folder), the local or RPC runner, and stopping the runner's worker process when the tune ends."""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlopt.backends.tvm.database import TUNING_EXTRAS
from rlopt.errors import UsageError
from rlopt.lazy import require


@dataclass
class RpcSpec:
    """MetaSchedule's RPC runner against a TVM tracker (`python -m tvm.exec.rpc_tracker`)."""

    host: str
    port: int
    key: str
    session_timeout_s: float = 120.0

    @classmethod
    def parse(cls, tracker: str, key: str | None) -> RpcSpec:
        host, sep, port = tracker.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise UsageError(f"--rpc-tracker '{tracker}': expected HOST:PORT; fix: e.g. --rpc-tracker 127.0.0.1:9190")
        if not key:
            raise UsageError("--rpc-tracker needs --rpc-key (the key the RPC servers registered with); "
                             "fix: add --rpc-key KEY")
        return cls(host, int(port), key)


def make_builder(cores: int, artifacts: Path) -> Any:
    """MetaSchedule's local builder on `cores` worker processes, exporting each candidate under `artifacts`."""
    from rlopt.backends.tvm.builder import build_candidate, export_candidate

    ms = require("tvm.s_tir.meta_schedule")
    artifacts.mkdir(parents=True, exist_ok=True)
    return ms.builder.LocalBuilder(f_build=build_candidate, max_workers=cores, timeout_sec=120,
                                   f_export=functools.partial(export_candidate, directory=str(artifacts)))


def make_runner(rpc: RpcSpec | None) -> Any:
    """MetaSchedule's local runner (one measuring process), or its RPC runner against `rpc`'s tracker."""
    ms = require("tvm.s_tir.meta_schedule")
    evaluator = ms.runner.EvaluatorConfig(number=20, repeat=3, min_repeat_ms=50, enable_cpu_cache_flush=False)
    if rpc is None:
        return ms.runner.LocalRunner(evaluator_config=evaluator, timeout_sec=60)
    from importlib.util import find_spec

    if find_spec("tornado") is None:
        raise UsageError(f"--rpc-tracker needs tornado (TVM's RPC); fix: {TUNING_EXTRAS}")
    config = ms.runner.RPCConfig(tracker_host=rpc.host, tracker_port=rpc.port, tracker_key=rpc.key,
                                 session_timeout_sec=int(rpc.session_timeout_s))
    return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator, max_workers=1)


def stop_workers(runner: Any) -> None:
    """End the runner's worker processes (`tvm.exec.popen_worker`) for good: TVM frees the runner only at exit.

    The pool's own `shutdown(wait=False)` kills the workers it has, but a measurement still queued (the RPC runner
    queues a whole batch; a spent budget or Ctrl-C leaves some) then starts a fresh worker on its thread, which
    nothing ever stops. So: cancel what is queued, kill the workers (a running measurement ends with its worker),
    join the pool's threads, and kill any worker a thread started meanwhile."""
    pool = getattr(runner, "pool", None)
    if pool is None:
        return
    threads = getattr(pool, "_threadpool", None)
    if threads is not None:
        threads.shutdown(wait=False, cancel_futures=True)
    # SIGKILL only, until the pool's threads are done: a thread waiting on its worker sees the pipe close and
    # cleans that worker up itself (TVM's PopenWorker.kill is not safe against a second caller), and one that
    # started a fresh worker between its lock and its send finds it killed too
    for _ in range(200):
        for worker in list(getattr(pool, "_worker_map", {}).values()):
            process = getattr(worker, "_proc", None)
            if process is not None and process.poll() is None:
                process.kill()
        running = [t for t in getattr(threads, "_threads", ()) if t.is_alive()]
        if not running:
            break
        for thread in running:
            thread.join(timeout=0.05)
    pool.shutdown(wait=True)  # closes the pipes and reaps what the threads left


__all__ = ["RpcSpec", "make_builder", "make_runner", "stop_workers"]
