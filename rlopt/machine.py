"""Facts about this machine, read without importing any heavy module."""

from __future__ import annotations

import os
import platform
import re
import shutil
import time
from functools import lru_cache
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


def torch_cuda_build() -> str | None:
    """The CUDA version torch was built for ('12.8'), None for a CPU build or without torch: read from
    torch/version.py, so torch is not imported (torch.version.cuda where it already is)."""
    import sys

    loaded = sys.modules.get("torch")
    if loaded is not None and getattr(loaded, "version", None) is not None:
        return getattr(loaded.version, "cuda", None)
    from importlib.util import find_spec

    try:
        spec = find_spec("torch")
    except (ImportError, ValueError):
        return None
    if spec is None or not spec.submodule_search_locations:
        return None
    import ast

    for folder in spec.submodule_search_locations:
        try:
            tree = ast.parse((Path(folder) / "version.py").read_text())
        except (OSError, SyntaxError):
            continue
        for node in tree.body:
            target = node.target if isinstance(node, ast.AnnAssign) else \
                (node.targets[0] if isinstance(node, ast.Assign) and len(node.targets) == 1 else None)
            if isinstance(target, ast.Name) and target.id == "cuda" and isinstance(node.value, ast.Constant):
                return node.value.value if isinstance(node.value.value, str) else None
    return None


def cuda_torch_absent_reason() -> str | None:
    """None when an NVIDIA GPU is visible and torch is a CUDA build, else why not (nothing imported)."""
    reason = gpu_absent_reason()
    if reason is not None:
        return reason
    if torch_cuda_build() is None:
        return "this torch is a CPU build (install a CUDA build of torch on the GPU machine)"
    return None


def _nvidia_smi_query() -> list[str] | None:
    """name, compute capability and driver of the first visible GPU, from nvidia-smi; None where it cannot say."""
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    visible = os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")[0].strip()
    try:
        done = subprocess.run([smi, "--query-gpu=name,compute_cap,driver_version", "--format=csv,noheader",
                               "-i", visible or "0"], capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    line = done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else ""
    fields = [field.strip() for field in line.split(",")]
    return fields if len(fields) == 3 else None


def _proc_driver_query() -> list[str | None] | None:
    """name and driver from /proc/driver/nvidia (no compute capability there); None without the driver."""
    root = Path("/proc/driver/nvidia")
    try:
        driver = re.search(r"Kernel Module\s+(\S+)", (root / "version").read_text())
        info = next(iter(sorted((root / "gpus").glob("*/information"))), None)
        name = re.search(r"Model:\s*(.+)", info.read_text()) if info is not None else None
    except OSError:
        return None
    return [name.group(1).strip() if name else None, None, driver.group(1) if driver else None]


@lru_cache(maxsize=1)
def gpu_identity() -> dict[str, str | None] | None:
    """The GPU that GPU artifacts are built and verified on, None without one: name, compute capability, driver,
    the CUDA runtime of torch's build and the TensorRT version (whichever distribution provides `tensorrt`). It
    joins the cache key of machine-dependent stages and the facts of GPU artifacts: a plan or a verdict from
    another GPU, driver or TensorRT is never reused. Read once per process, without CUDA libraries."""
    if gpu_absent_reason() is not None:
        return None
    from rlopt.lazy import module_version

    name, capability, driver = _nvidia_smi_query() or _proc_driver_query() or [None, None, None]
    return {"name": name, "compute_capability": capability, "driver": driver, "cuda_runtime": torch_cuda_build(),
            "tensorrt": module_version("tensorrt")}


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
            "python": platform.python_version(), "gpu": gpu_absent_reason() is None, "gpu_identity": gpu_identity()}
