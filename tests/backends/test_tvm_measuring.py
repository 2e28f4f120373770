"""MetaSchedule's measuring workers: stopped for good when a tune ends, however it ends."""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from rlopt.backends.tvm.measuring import stop_workers


def _popen_workers() -> list[int]:
    import psutil

    found = []
    for child in psutil.Process().children(recursive=True):
        try:
            if "tvm.exec.popen_worker" in " ".join(child.cmdline()) and child.status() != psutil.STATUS_ZOMBIE:
                found.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return found


def test_stop_workers_leaves_no_worker_behind_with_measurements_queued() -> None:
    """A spent budget or Ctrl-C stops tuning with measurements queued (the RPC runner queues a batch): the pool's
    own shutdown(wait=False) killed the running workers, and each queued measurement then started a fresh one."""
    pytest.importorskip("psutil")
    popen_pool = pytest.importorskip("tvm.support.popen_pool")

    pool = popen_pool.PopenPoolExecutor(max_workers=1, timeout=120)
    futures = [pool.submit(time.sleep, 60) for _ in range(3)]
    try:
        while not _popen_workers():  # the worker is measuring (pytest's timeout bounds a hang)
            time.sleep(0.05)
        stop_workers(SimpleNamespace(pool=pool))
        assert all(f.done() for f in futures), "nothing queued runs after the stop"
        assert _popen_workers() == [], "no tvm.exec.popen_worker outlives the stop"
        assert sum(f.cancelled() for f in futures) == 2 and all(f.exception() for f in futures if not f.cancelled())
    finally:  # should stop_workers fail, the pool's threads would keep this process alive at exit
        for future in futures:
            future.cancel()
        _kill(_popen_workers())


def _kill(pids: list[int]) -> None:
    import psutil

    for pid in pids:
        try:
            psutil.Process(pid).kill()
        except psutil.NoSuchProcess:
            pass


def test_a_runner_without_a_pool_is_left_alone() -> None:
    stop_workers(SimpleNamespace())
    stop_workers(SimpleNamespace(pool=None))
