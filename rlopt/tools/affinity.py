"""The cores this process may run on: one helper for bench and warmup (rlopt.machine has none)."""

from __future__ import annotations

import os


def affinity() -> set[int]:
    """The cores the calling thread may run on (a container or a pinned thread has fewer than os.cpu_count())."""
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores the calling thread may run on."""
    return len(affinity())


def load_average() -> list[float] | None:
    """1/5/15-minute load averages: a measurement on a busy machine says so."""
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


__all__ = ["affinity", "load_average", "usable_cores"]
