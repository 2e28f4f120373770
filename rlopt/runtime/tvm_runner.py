"""TVM runner: exact-shape dispatch to tuned static builds, the dynamic build for every other shape, a lean call.

Why the call path looks like this (measured on the tuned [1,1,768] policy, kernels ~11 us):
- `tvm.runtime.tensor(np)` copies and costs ~20 us; `from_dlpack` wraps the numpy buffer in
  ~0.6 us. Kernels may use aligned vector loads, so only 64-byte-aligned arrays are wrapped;
  others are copied into a preallocated aligned buffer (~1 us), never a fresh allocation.
- `out.numpy()` copies (13 us for two outputs); `np.from_dlpack(out)` hands the VM's fresh
  output buffer to numpy without a copy.
- The VM function is looked up once; each thread gets its own VM (a VM is not re-entrant).
- TVM's thread count (chosen by measurement at compile time) is set through TVM_NUM_THREADS
  before TVM first starts its pool; a user's own TVM_NUM_THREADS wins.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable

import numpy as np

from rlopt.errors import ArtifactError, BackendUnavailable, located
from rlopt.lazy import require
from rlopt.runtime.outputs import flatten_outputs

ALIGNMENT = 64
STAGE_BYTES = 64 * 1024
ShapeKey = tuple[tuple[int, ...], ...]


@dataclass
class _CallPlan:
    """What one thread needs to call one library at one input signature, worked out on the first call."""

    function: Any
    staged: list[tuple[np.ndarray, Any] | None]
    small: list[bool]
    passthrough: list[bool] | None = None


def bucket_files(facts: dict[str, Any]) -> list[dict[str, Any]]:
    """The per-shape libraries a TVM artifact lists in its facts (each with path, sha256, bytes)."""
    return [build["file"] for build in facts.get("shape_builds", []) if isinstance(build, dict) and "file" in build]


def checked_sibling(primary: Path, record: dict[str, Any]) -> Path:
    """A shape-bucket library next to the (already checked) primary library, after its size and sha256 match."""
    from rlopt.manifest import sha256_file

    name = PurePosixPath(str(record.get("path", ""))).name
    path = primary.parent / name
    if not name or not path.is_file():
        raise ArtifactError(located(path, "", "TVM shape-bucket library listed in manifest.json is missing",
                                    "recompile MODEL_DIR"))
    if path.stat().st_size != record.get("bytes") or sha256_file(path) != record.get("sha256"):
        raise ArtifactError(located(path, "sha256", "does not match manifest.json (corrupt or modified)",
                                    "recompile MODEL_DIR"))
    return path


class TvmRunner:
    """One dynamic library plus zero or more exact-shape libraries, all checked before they are loaded."""

    def __init__(self, path: Path, input_names: list[str], facts: dict[str, Any], *, dispatch: bool = True) -> None:
        from rlopt.runtime.cpu_features import missing_features

        target = facts.get("target", {})
        if target.get("kind") == "llvm":
            lacking = missing_features(list(facts.get("cpu_features", [])))
            if lacking:
                raise BackendUnavailable(f"TVM library built for mcpu '{target.get('mcpu')}' needs CPU features "
                                         f"this CPU lacks ({', '.join(lacking[:6])}); fix: recompile on this machine")
        # TVM reads this once, when its thread pool first starts (default here: half the cores, i.e. 1);
        # configuring the pool later would pin the calling thread to one core, so it is never done.
        os.environ.setdefault("TVM_NUM_THREADS", str(int(facts.get("num_threads") or os.cpu_count() or 1)))
        self._tvm = require("tvm")
        self._relax = require("tvm.relax")
        self._from_dlpack = require("tvm_ffi").from_dlpack
        self._device = self._tvm.cuda(0) if target.get("kind") == "cuda" else self._tvm.cpu(0)
        if target.get("kind") == "cuda" and not self._device.exist:
            raise BackendUnavailable("TVM library targets CUDA but no CUDA device is present here")
        self._names = input_names
        self._on_cpu = target.get("kind") != "cuda"
        self._libraries: dict[ShapeKey | None, Any] = {None: self._load(path)}
        if dispatch:
            for build in facts.get("shape_builds", []):
                shapes = build.get("shapes", {})
                key = tuple(tuple(int(d) for d in shapes[name]) for name in input_names)
                self._libraries[key] = self._load(checked_sibling(path, build["file"]))
        self._local = threading.local()

    def _load(self, path: Path) -> Any:
        try:
            return self._tvm.runtime.load_module(str(path))
        except Exception as exc:  # tvm raises TVMError subclasses of its own for a bad .so
            raise ArtifactError(located(path, "", f"TVM cannot load it ({str(exc).splitlines()[0]})",
                                        "recompile MODEL_DIR")) from None

    @property
    def shape_buckets(self) -> list[ShapeKey]:
        return [key for key in self._libraries if key is not None]

    def _thread_state(self) -> Any:
        state = self._local
        if not hasattr(state, "plans"):
            state.vms = {key: self._relax.VirtualMachine(lib, self._device) for key, lib in self._libraries.items()}
            state.functions = {key: vm["main"] for key, vm in state.vms.items()}
            state.plans = {}
        return state

    def _staging(self, array: np.ndarray) -> tuple[np.ndarray, Any]:
        """A 64-byte-aligned array like `array` and its TVM view, made once per thread and shape."""
        raw = np.empty(array.nbytes + ALIGNMENT, dtype=np.uint8)
        offset = (-raw.ctypes.data) % ALIGNMENT
        buffer = raw[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
        return buffer, self._from_dlpack(buffer, require_alignment=ALIGNMENT)

    def _plan(self, state: Any, key: Any, arrays: list[np.ndarray], dispatch: bool) -> _CallPlan:
        function = state.functions.get(tuple(a.shape for a in arrays) if dispatch else None) or state.functions[None]
        small = [self._on_cpu and a.nbytes <= STAGE_BYTES for a in arrays]
        plan = _CallPlan(function, [self._staging(a) if fits else None for a, fits in zip(arrays, small)], small)
        state.plans[key] = plan
        return plan

    def _wrap(self, array: np.ndarray, plan: _CallPlan, slot: int) -> Any:
        """Small inputs are copied into an aligned per-thread buffer (cheaper than wrapping); large ones are
        wrapped without a copy when 64-byte aligned, else copied into an aligned per-thread buffer."""
        if not self._on_cpu:
            return self._tvm.runtime.tensor(array, device=self._device)
        staged = plan.staged[slot]
        if staged is None or not plan.small[slot]:
            tensor = self._from_dlpack(array, require_contiguous=True)
            if tensor.data_ptr() % ALIGNMENT == 0:  # data_ptr(): 0.1 us; array.ctypes.data costs ~3 us
                return tensor
            if staged is None:
                staged = plan.staged[slot] = self._staging(array)
        np.copyto(staged[0], array)
        return staged[1]

    def _run(self, feeds: dict[str, np.ndarray], dispatch: bool) -> list[np.ndarray]:
        state = self._local if hasattr(self._local, "plans") else self._thread_state()
        arrays = [feeds[name] for name in self._names]
        key = (dispatch, *((a.shape, a.dtype) for a in arrays))
        plan = state.plans.get(key) or self._plan(state, key, arrays, dispatch)
        inputs = [self._wrap(a, plan, slot) for slot, a in enumerate(arrays)]
        result = plan.function(*inputs)
        results = [result] if hasattr(result, "data_ptr") else flatten_outputs(result)
        if not self._on_cpu:
            return [t.numpy() for t in results]
        if plan.passthrough is None:
            # an output that is an input passed through must not alias the caller's array or a staging buffer
            held = {t.data_ptr() for t in inputs}
            plan.passthrough = [t.data_ptr() in held for t in results]
        return [np.from_dlpack(t).copy() if copy else np.from_dlpack(t) for t, copy in zip(results, plan.passthrough)]

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self._run(feeds, dispatch=True)

    def infer_dynamic(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Always the dynamic library: what serves shapes without a bucket (verified on its own at compile time)."""
        return self._run(feeds, dispatch=False)

    def parity_variants(self) -> dict[str, Callable[[dict[str, np.ndarray]], list[np.ndarray]]]:
        """Code paths `infer` may not exercise on the reference shapes, for the parity gate to check too."""
        return {"dynamic": self.infer_dynamic} if self.shape_buckets else {}

    def close(self) -> None:
        self._libraries = {}
        self._local = threading.local()
