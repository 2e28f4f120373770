"""This machine's limits for scripts/bench.py, measured in the same run as the benchmark, so each result can be
read as a fraction of the hardware:
- large-sgemm GFLOP/s (numpy float32 matmul, n = 4096, best of 3): a practical compute roof (numpy's
  OpenBLAS; ONNX Runtime's MLAS can beat it on cache-resident weights, so a fraction can exceed 100%);
- read bandwidth (numpy sum over a 256 MiB array, best of 5);
- the roofs no fp32 code can pass, from scripts/roofline.c (built here with the system C compiler; absent,
  with the reason, where there is none): the FMA peak on 1 and on all cores (the table's issue 5 target
  column reads a target as a share of it); `Roofline.read_us` also times one read of N bytes from cache.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent


def sgemm_gflops(n: int = 4096, repeats: int = 3) -> float:
    """Best-of-N float32 matmul throughput with numpy's BLAS, all its threads."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((n, n), dtype=np.float32)
    b = rng.standard_normal((n, n), dtype=np.float32)
    a @ b
    best = min(_timed(lambda: a @ b) for _ in range(repeats))
    return 2 * n**3 / best / 1e9


def read_bandwidth_gbs(mib: int = 256, repeats: int = 5) -> float:
    """Best-of-N bytes per second of a sum over an array far larger than the caches."""
    data = np.ones(mib * (1 << 20) // 4, dtype=np.float32)
    data.sum()
    best = min(_timed(data.sum) for _ in range(repeats))
    return data.nbytes / best / 1e9


class Roofline:
    """scripts/roofline.c, compiled for this CPU: FMA peak and cache-resident read time (see its header)."""

    def __init__(self, work_dir: Path) -> None:
        self.binary: Path | None = None
        self.reason = ""
        name = os.environ.get("CC", "cc")
        compiler = shutil.which(name)
        if compiler is None:
            self.reason = f"no C compiler ({name}) on this machine"
            return
        binary = work_dir / "roofline"
        built = subprocess.run([compiler, "-O3", "-march=native", "-fopenmp", str(ROOT / "scripts" / "roofline.c"),
                                "-o", str(binary)], capture_output=True, text=True)
        if built.returncode != 0:
            self.reason = f"cc could not build scripts/roofline.c: {(built.stderr.strip().splitlines() or ['?'])[-1]}"
            return
        self.binary = binary

    def _ask(self, *args: int | str) -> list[float]:
        assert self.binary is not None
        done = subprocess.run([str(self.binary), *map(str, args)], capture_output=True, text=True, check=True)
        return [float(v) for v in done.stdout.split()]

    def peak_gflops(self, threads: int) -> float | None:
        return self._ask("peak", threads)[0] if self.binary else None

    def read_us(self, nbytes: int, threads: int | None = None) -> float | None:
        """On `threads` threads, else the faster of one core and all cores: small weights do not pay for waking a
        second thread."""
        if self.binary is None:
            return None
        from rlopt.machine import usable_cores

        return min(self._ask("read", nbytes, n)[1] for n in ({threads} if threads else {1, usable_cores()}))


def _timed(call: Any) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def openblas_core() -> str | None:
    """The kernel family numpy's OpenBLAS dispatched to on this CPU (it falls back to Haswell = AVX2 on CPUs it
    does not know, e.g. Zen 5, so its sgemm is an AVX2 roof, not the AVX-512 peak that TVM and MLAS use)."""
    import ctypes
    import glob

    root = Path(np.__file__).parent.parent
    for library in glob.glob(str(root / "numpy.libs" / "*openblas*")) + glob.glob(str(root / "scipy_openblas*" / "lib" / "*.so")):
        for name in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename"):
            try:
                function = getattr(ctypes.CDLL(library), name)
            except (OSError, AttributeError):
                continue
            function.restype = ctypes.c_char_p
            return str(function().decode())
    return None


def measure_limits(work_dir: Path) -> dict[str, Any]:
    """The roofs, once per invocation (about 10 s), into the JSON and the table set's header line."""
    from rlopt.machine import usable_cores

    roofline = Roofline(work_dir)
    cores = usable_cores()
    limits = {"sgemm_gflops": round(sgemm_gflops(), 2), "read_bandwidth_gbs": round(read_bandwidth_gbs(), 2),
              "sgemm_openblas_core": openblas_core(), "cores": cores,
              "fma_peak_gflops_1_core": roofline.peak_gflops(1), "fma_peak_gflops": roofline.peak_gflops(cores),
              "roofline_unavailable": roofline.reason or None}
    return limits


