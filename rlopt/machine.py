"""Facts about this machine, read without importing any heavy module."""

from __future__ import annotations

import os
import platform
import shutil
import time
from pathlib import Path
from typing import Any, Callable


def usable_core_ids() -> set[int]:
    """The cores the calling thread may run on (its affinity: a container or a pinned process has fewer than
    os.cpu_count(); where the platform cannot say, every core)."""
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))
    return set(range(os.cpu_count() or 1))


def usable_cores() -> int:
    """How many cores the calling thread may run on: the one count of cores for thread pools, timing and reports."""
    return len(usable_core_ids())


def cache_root() -> Path:
    """`$RLOPT_CACHE`, else `$XDG_CACHE_HOME/rlopt`, else `~/.cache/rlopt` (contract section 7): the stage cache,
    and the logs of native libraries and internal errors."""
    if os.environ.get("RLOPT_CACHE"):
        return Path(os.environ["RLOPT_CACHE"])
    if os.environ.get("XDG_CACHE_HOME"):
        return Path(os.environ["XDG_CACHE_HOME"]) / "rlopt"
    return Path.home() / ".cache" / "rlopt"


def load_average() -> list[float] | None:
    """1/5/15-minute load averages: a measurement on a busy machine says so."""
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


def cpu_seconds() -> tuple[float, float] | None:
    """(CPU seconds used by every process on the machine plus those the hypervisor stole from it, CPU seconds of this
    process's threads and of its children), both since some fixed point; None where /proc/stat is absent. A child
    that times a candidate for this process is this process's work, not another's."""
    try:
        with open("/proc/stat") as stat:
            fields = stat.readline().split()
    except OSError:
        return None
    if len(fields) < 9 or fields[0] != "cpu":
        return None
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(v) for v in fields[1:9])
    tick, own = os.sysconf("SC_CLK_TCK"), os.times()
    return ((user + nice + system + irq + softirq + steal) / tick,
            time.process_time() + own.children_user + own.children_system + _running_children_ticks() / tick)


def _running_children_ticks() -> int:
    """CPU ticks of this process's children still running (their own and their waited-for children's), from
    /proc/<pid>/stat: a worker this process keeps is its own work too (os.times counts children once waited for)."""
    me, ticks = os.getpid(), 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            with open(f"/proc/{entry.name}/stat") as stat:
                text = stat.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()  # from field 3 (state): ppid is [1], utime..cstime [11:15]
        if len(fields) > 14 and int(fields[1]) == me:
            ticks += sum(int(v) for v in fields[11:15])
    return ticks


class OtherLoad:
    """A context that measures how many cores' worth of CPU other processes used, or the hypervisor stole, while
    it was open: what a timing of this process's thread pools competed with. `cores` stays None where the platform
    cannot tell; /proc/stat counts in scheduler ticks (10 ms), so a window of a second or more reads to a few %."""

    def __init__(self, read: Callable[[], tuple[float, float] | None] = cpu_seconds,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read, self._clock, self.cores = read, clock, None
        self._start: tuple[float, tuple[float, float] | None] = (0.0, None)

    def __enter__(self) -> OtherLoad:
        self._start = (self._clock(), self._read())
        return self

    def __exit__(self, *exc: object) -> None:
        began, start = self._start
        end, wall = self._read(), self._clock() - began
        if start is not None and end is not None and wall > 0:
            self.cores = max(0.0, ((end[0] - start[0]) - (end[1] - start[1])) / wall)


def gpu_absent_reason() -> str | None:
    """None when an NVIDIA GPU is visible, else the reason it is not (checked without CUDA libraries)."""
    if os.environ.get("CUDA_VISIBLE_DEVICES") in ("", "-1"):
        return "CUDA_VISIBLE_DEVICES hides every GPU"
    if not Path("/dev/nvidiactl").exists() and not any(Path("/dev").glob("nvidia[0-9]*")):
        return "no NVIDIA GPU on this machine (/dev/nvidia* absent)"
    if shutil.which("nvidia-smi") is None and not Path("/proc/driver/nvidia/version").exists():
        return "no NVIDIA driver on this machine"
    return None


def cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def cpu_identity() -> str:
    """The CPU model and its feature flags, hashed: code generated for this host is valid for this identity."""
    import hashlib

    flags = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                flags = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{cpu_model()} {hashlib.sha256(flags.encode()).hexdigest()[:16]}"


def machine_facts() -> dict[str, Any]:
    return {"cpu": cpu_model(), "cores": os.cpu_count(), "platform": platform.platform(),
            "python": platform.python_version(), "gpu": gpu_absent_reason() is None}
