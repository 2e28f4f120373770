"""TVM's pool, per calling thread: its size (`size_thread_pool`), and the busy-core fallback for a pool of several.

TVM's fork-join cuts each parallel loop into one fixed chunk per thread and the caller waits for every chunk; when
another process holds a core, the chunk on that core waits for a scheduler slot and the whole call with it
(one-thread speed to 5-8x slower; docs/benchmarks.md, "The stall"). An `auto` route therefore runs TVM on its calling
thread alone (`TvmFacts.calling_thread_only`), where nothing can stall. A runner opened on its own (`rlopt tvm`) runs
the build's count; there, the fallback: compile measured each tuned shape at one thread and at the chosen count
(`facts.thread_latency_us`), so the runtime knows what one thread would cost: when most calls take longer than that
in STREAK windows running, the pool is a loss here and now, and the calling thread's pool is re-sized to one thread
for good.

Opt-in (RLOPT_TVM_STALL_FALLBACK=1): under the bench protocol the watch switched on passing stalls and, never
switching back, left the default policy's max shape at one-thread speed (1.9x ONNX Runtime's best against 1.13-1.16x
with the pool kept, two runs each, docs/benchmarks.md). It pays off on a host where another process holds a core
for good.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Mapping
from time import perf_counter_ns
from typing import Any

WINDOW = 32  # calls per verdict
STREAK = 3  # stalled windows in a row before the switch: another process's burst of a few tens of ms does not decide
CLEAR_WIN = 1.2  # a shape is watched only where the pool was this much faster than one thread at compile time
FALLBACK_ENV = "RLOPT_TVM_STALL_FALLBACK"  # =1: watch and re-size; unset or 0: keep the compiled thread count
_pool_lock = threading.Lock()
_this_thread = threading.local()  # whether this thread's pool was re-sized already (by any runner)


def watch_limit_us(thread_latency: Mapping[str, Any], threads: int) -> float | None:
    """One thread's compile-time latency at a shape, when the pool of `threads` was a clear win there; else None
    (nothing to protect: at such a shape the pool's calls may well exceed one thread's figure)."""
    one, many = thread_latency.get("1"), thread_latency.get(str(threads))
    if threads <= 1 or not one or not many or float(many) * CLEAR_WIN > float(one):
        return None
    return float(one)


class StallGuard:
    """Counts, per window of WINDOW calls, the calls slower than `limit_us`; calls `on_stall` once when more than
    half of the calls were in each of STREAK windows in a row (each window's median above one thread's latency).
    Per thread and shape: no lock, no allocation per call."""

    __slots__ = ("calls", "limit_ns", "on_stall", "slow", "streak", "tripped")

    def __init__(self, limit_us: float, on_stall: Callable[[StallGuard], None]) -> None:
        self.limit_ns, self.on_stall = int(limit_us * 1e3), on_stall
        self.calls = self.slow = self.streak = 0
        self.tripped = False

    def observe(self, elapsed_ns: int) -> None:
        self.calls += 1
        if elapsed_ns > self.limit_ns:
            self.slow += 1
        if self.calls >= WINDOW:
            self.streak = self.streak + 1 if self.slow * 2 > self.calls else 0
            self.calls = self.slow = 0
            if self.streak >= STREAK and not self.tripped:
                self.tripped = True
                self.on_stall(self)


def timed(call: Callable[..., Any], guard: StallGuard) -> Callable[..., Any]:
    """`call` (a plan or a bound call) with each call's duration reported to `guard`: one perf_counter_ns either
    side."""
    observe = guard.observe

    def run(*args: Any) -> Any:
        start = perf_counter_ns()
        out = call(*args)
        observe(perf_counter_ns() - start)
        return out

    return run


def _configure(threads: int, cpus: list[str], configure: Callable[[int, int, list[str]], Any] | None) -> None:
    """TVM's `runtime.config_threadpool` for the calling thread's pool (`configure` in tests), with
    TVM_BIND_THREADS=0 meanwhile: else TVM pins the calling thread to one core, as `build.choose_threads` avoids."""
    if configure is None:
        from rlopt.lazy import require

        configure = require("tvm_ffi").get_global_func("runtime.config_threadpool")
    with _pool_lock:
        previous = os.environ.get("TVM_BIND_THREADS")
        os.environ["TVM_BIND_THREADS"] = "0"
        try:
            configure(1, threads, cpus)
        finally:
            if previous is None:
                os.environ.pop("TVM_BIND_THREADS", None)
            else:
                os.environ["TVM_BIND_THREADS"] = previous


def size_thread_pool(threads: int, configure: Callable[[int, int, list[str]], Any] | None = None) -> None:
    """Size the calling thread's TVM pool to `threads` (at most the workers it was created with: TVM_NUM_THREADS
    when it started). One thread is a one-CPU list: TVM's concurrency for this thread is then 1 and its parallel
    loops run inline on the caller, so no worker is woken, none waits to be scheduled (a pool's fork-join gives each
    worker a fixed chunk and waits for it: with another process on the worker's core, the call stalls) and none is
    left spinning (an idle worker yields up to 300000 times before it sleeps). A runner calls it once per thread,
    as its calls find the pool: another runner, or the build's thread choice, may have sized it."""
    _configure(threads, ["0"] if threads == 1 else [], configure)
    _this_thread.size = threads


def thread_pool_size() -> int | None:
    """What rlopt last sized the calling thread's pool to (None: never: TVM_NUM_THREADS applies)."""
    return getattr(_this_thread, "size", None)


def one_thread_pool(configure: Callable[[int, int, list[str]], Any] | None = None) -> bool:
    """The fallback's switch: this thread's pool to one thread (`size_thread_pool`), once; False when this thread
    switched already."""
    if getattr(_this_thread, "one", False):
        return False
    _this_thread.one = True
    size_thread_pool(1, configure)
    return True


def fallback_enabled() -> bool:
    return os.environ.get(FALLBACK_ENV, "") not in ("", "0")


__all__ = ["CLEAR_WIN", "FALLBACK_ENV", "STREAK", "WINDOW", "StallGuard", "fallback_enabled", "one_thread_pool", "size_thread_pool",
           "thread_pool_size", "timed", "watch_limit_us"]
