"""TVM (Relax): fused, MetaSchedule-tuned libraries per named shape plus one dynamic library."""

from __future__ import annotations

import os
from typing import Any

from rlopt.backends.base import Backend, module_missing
from rlopt.machine import gpu_absent_reason


def device_kind(target: dict[str, Any]) -> str:
    return "cuda" if target.get("kind") == "cuda" else "cpu"


def _unavailable(facts: dict[str, Any]) -> str | None:
    missing = module_missing("tvm")
    if missing:
        return missing
    target = facts.get("target", {})
    if device_kind(target) == "cuda":
        return gpu_absent_reason()
    if facts.get("cpu_features"):
        from rlopt.backends.tvm.cpu_features import missing_features

        lacking = missing_features(list(facts["cpu_features"]))
        if lacking:
            return f"built for mcpu '{target.get('mcpu')}', this CPU lacks {', '.join(lacking[:6])}"
    return None


def _threads(facts: dict[str, Any]) -> int | str:
    configured = os.environ.get("TVM_NUM_THREADS", "")
    return int(configured) if configured.isdigit() else int(facts.get("num_threads") or 0) or "TVM default"


BACKEND = Backend(
    name="tvm", module="tvm",
    runner="rlopt.backends.tvm.runner:TvmRunner",
    build="rlopt.backends.tvm.build:build_tvm",
    unavailable=_unavailable, threads=_threads, native=True,
    stages=("rlopt.backends.tvm.stages:TvmCudaBuild", "rlopt.backends.tvm.stages:TvmBuild"))
