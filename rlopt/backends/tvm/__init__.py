"""TVM (Relax): fused, MetaSchedule-tuned libraries per named shape plus one dynamic library."""

from __future__ import annotations

import os

from rlopt.backends.base import module_missing
from rlopt.backends.capability import Backend
from rlopt.backends.tvm.config import TvmConfig
from rlopt.backends.tvm.facts import TvmFacts
from rlopt.machine import gpu_absent_reason


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
    if facts.calling_thread_only:
        return 1
    configured = os.environ.get("TVM_NUM_THREADS", "")
    return int(configured) if configured.isdigit() else facts.num_threads or "TVM default"


def _one_thread(facts: TvmFacts) -> TvmFacts:
    """TVM keeps one pool per calling thread: a runner with these facts sizes each calling thread's pool to one
    thread, so its parallel loops run inline (stall.size_thread_pool)."""
    return TvmFacts.of(facts).updated(num_threads=1, calling_thread_only=True)


BACKEND = Backend(
    name="tvm", module="tvm",
    runner="rlopt.backends.tvm.runner:TvmRunner",
    unavailable=_unavailable, threads=_threads, facts=TvmFacts, config=TvmConfig, native=True,
    distributions=(("apache-tvm", ("apache-tvm",)), ("apache-tvm-ffi", ("apache-tvm-ffi",))),
    pads_gemm=lambda config: config.on_cuda,
    stages=("rlopt.backends.tvm.stages:TvmCudaBuild", "rlopt.backends.tvm.stages:TvmBuild"),
    refit="rlopt.backends.tvm.refit:refit_artifact",
    runtime_env=(("TVM_USE_RUNTIME_LIB", "1"),), one_thread=_one_thread,
    # its fork-join waits for each worker's fixed chunk: a busy core stalls a pool, so `auto` routes it on one thread
    pool_stalls=True)
