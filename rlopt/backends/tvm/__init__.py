"""TVM (Relax): fused, MetaSchedule-tuned libraries per named shape plus one dynamic library."""

from __future__ import annotations

import os

from rlopt.backends.base import module_missing
from rlopt.backends.capability import Backend
from rlopt.backends.tvm.config import TvmConfig
from rlopt.backends.tvm.facts import TvmFacts
from rlopt.machine import gpu_absent_reason, usable_cores


def _unavailable(facts: TvmFacts) -> str | None:
    missing = module_missing("tvm")
    if missing:
        return missing
    if facts.device_kind == "cuda":
        return gpu_absent_reason()
    if facts.cpu_features:
        from rlopt.backends.tvm.cpu_features import missing_features

        lacking = missing_features(list(facts.cpu_features))
        if lacking:
            return f"built for mcpu '{facts.target.get('mcpu')}', this CPU lacks {', '.join(lacking[:6])}"
    return None


def _threads(facts: TvmFacts) -> int | str:
    configured = os.environ.get("TVM_NUM_THREADS", "")
    return int(configured) if configured.isdigit() else facts.num_threads or "TVM default"


def _stall_floor(facts: TvmFacts) -> dict[str, float]:
    """One thread's compile-time latency per tuned shape, where the build chose a pool spanning every usable core:
    TVM's fork-join gives each thread one fixed chunk, so with no core to spare, a call whose other core is busy
    runs at about one thread's speed, so a pool's latency under load is floored at its one-thread figure
    (docs/benchmarks.md, "The stall")."""
    threads = facts.num_threads or 1  # the build's choice: TVM_NUM_THREADS in a compiling process may be another
    if threads <= 1 or threads < usable_cores():  # network's, set when its runner opened
        return {}
    return {label: float(row["1"]) for label, row in facts.thread_latency_us.items()
            if isinstance(row, dict) and row.get("1")}


def _one_thread(facts: TvmFacts) -> TvmFacts:
    """TVM keeps one pool per calling thread: this thread's parallel loops then run inline (stall.one_thread_pool)."""
    from rlopt.backends.tvm.stall import one_thread_pool
    from rlopt.lazy import require

    require("tvm")
    one_thread_pool()
    return facts


BACKEND = Backend(
    name="tvm", module="tvm",
    runner="rlopt.backends.tvm.runner:TvmRunner",
    unavailable=_unavailable, threads=_threads, facts=TvmFacts, config=TvmConfig, native=True,
    distributions=(("apache-tvm", ("apache-tvm",)), ("apache-tvm-ffi", ("apache-tvm-ffi",))),
    pads_gemm=lambda config: config.on_cuda,
    stages=("rlopt.backends.tvm.stages:TvmCudaBuild", "rlopt.backends.tvm.stages:TvmBuild"),
    refit="rlopt.backends.tvm.refit:refit_artifact",
    runtime_env=(("TVM_USE_RUNTIME_LIB", "1"),), stall_floor=_stall_floor, one_thread=_one_thread)
