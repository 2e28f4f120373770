"""TVM runner: exact-shape dispatch to tuned static builds, the dynamic build for every other shape, a lean call.

A shape with its own tuned static library runs as a `KernelChain` (chain.py); a shape without one is zero-padded
into a bigger build (`PaddedCall`, padding.py) once the parity gate passed padding, else it runs the dynamic
library through a per-thread VM (`VmCall`). The VM function is looked up once; each thread gets its own VM (a VM
is not re-entrant). TVM's thread count (chosen by measurement at compile time) is set through TVM_NUM_THREADS
before TVM first starts its pool; a user's own TVM_NUM_THREADS wins, except where the facts say `calling_thread_only`
(an `auto` route): each calling thread's pool then runs one thread (stall.size_thread_pool). A pool of several
threads is watched at the shapes where it won at compile time and re-sized to one thread when its calls stall
(stall.py, opt-in).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from rlopt.backends.base import BoundCall, Runner, flatten_outputs
from rlopt.backends.tvm import chain as _chain
from rlopt.backends.tvm.chain import ALIGNMENT, KernelChain, record_chain
from rlopt.backends.tvm.facts import ShapeKey, TvmFacts
from rlopt.backends.tvm.padding import PaddedBucket, PaddedCall, padding_plan
from rlopt.backends.tvm.stall import (StallGuard, fallback_enabled, one_thread_pool, size_thread_pool,
                                      thread_pool_size, timed, watch_limit_us)
from rlopt.errors import ArtifactError, BackendUnavailable, first_line, located
from rlopt.files import checked_sibling
from rlopt.lazy import require
from rlopt.machine import usable_cores
from rlopt.arrays import shape_label


def _with_params(main: Any, params: list[Any]) -> Any:
    """`main` with the library's weights bound after the inputs (`main` itself when they are baked in)."""
    if not params:
        return main
    bound = tuple(params)
    return lambda *inputs: main(*inputs, *bound)


@dataclass
class VmCall:
    """One library's VM function at one input signature: inputs wrapped or staged, outputs handed over."""

    function: Any
    staged: list[tuple[np.ndarray, Any] | None]
    small: list[bool]
    runner: TvmRunner
    passthrough: list[bool] | None = None

    def _wrap(self, array: np.ndarray, slot: int) -> Any:
        """Small inputs are copied into an aligned per-thread buffer (cheaper than wrapping); large ones are
        wrapped without a copy when 64-byte aligned, else copied into an aligned per-thread buffer."""
        runner = self.runner
        if not runner.on_cpu:
            return runner.tvm.runtime.tensor(array, device=runner.device)
        staged = self.staged[slot]
        if staged is None or not self.small[slot]:
            tensor = runner.from_dlpack(array, require_contiguous=True)
            if tensor.data_ptr() % ALIGNMENT == 0:  # data_ptr(): 0.1 us; array.ctypes.data costs ~3 us
                return tensor
            if staged is None:
                staged = self.staged[slot] = runner.staging(array)
        np.copyto(staged[0], array)
        return staged[1]

    def __call__(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        inputs = [self._wrap(a, slot) for slot, a in enumerate(arrays)]
        result = self.function(*inputs)
        results = [result] if hasattr(result, "data_ptr") else flatten_outputs(result)
        if not self.runner.on_cpu:
            return [t.numpy() for t in results]
        if self.passthrough is None:
            # an output that is an input passed through must not alias the caller's array or a staging buffer
            held = {t.data_ptr() for t in inputs}
            self.passthrough = [t.data_ptr() in held for t in results]
        return [np.from_dlpack(t).copy() if copy else np.from_dlpack(t) for t, copy in zip(results, self.passthrough)]


class TvmRunner(Runner):
    """One dynamic library plus zero or more exact-shape libraries, all checked before they are loaded."""

    def __init__(self, path: Path, input_names: list[str], facts: TvmFacts | Mapping[str, Any], *,
                 dispatch: bool = True) -> None:
        from rlopt.backends.tvm.cpu_features import missing_features

        facts = TvmFacts.of(facts)
        target = facts.target
        if target.get("kind") == "llvm":
            lacking = missing_features(list(facts.cpu_features))
            if lacking:
                raise BackendUnavailable(f"TVM library built for mcpu '{target.get('mcpu')}' needs CPU features "
                                         f"this CPU lacks ({', '.join(lacking[:6])}); fix: recompile on this machine")
        # TVM reads this once, when its thread pool first starts (default here: half the cores, i.e. 1); only
        # the stall fallback re-sizes a pool later (with TVM_BIND_THREADS=0, else the caller is pinned to a core)
        os.environ.setdefault("TVM_NUM_THREADS", str(facts.num_threads or usable_cores()))
        self.tvm = require("tvm")
        self._vm = require("tvm.runtime.vm")  # what tvm.relax re-exports, without the compiler
        self.from_dlpack = require("tvm_ffi").from_dlpack
        self.device = self.tvm.cuda(0) if not facts.on_cpu else self.tvm.cpu(0)
        if not facts.on_cpu and not self.device.exist:
            raise BackendUnavailable("TVM library targets CUDA but no CUDA device is present here")
        self.input_names = input_names
        self.on_cpu = facts.on_cpu
        self._libraries: dict[ShapeKey | None, Any] = {None: self._load(path)}
        names: dict[ShapeKey | None, list[str]] = {None: facts.param_names}
        if dispatch:
            for build in facts.shape_builds:
                if build.file is None:
                    raise ArtifactError(located(path, "facts.shape_builds", "a shape build lists no library file",
                                                "recompile MODEL_DIR"))
                self._libraries[build.key(input_names)] = self._load(checked_sibling(path, build.file))
                names[build.key(input_names)] = build.param_names
        self._params = self._bind_params(path, facts, names)
        self.padding = padding_plan(facts.shape_builds, input_names) if self.on_cpu and dispatch else None
        self.pads = self.padding is not None and facts.gate_passed("padded")
        self._local = threading.local()
        self.calling_thread_only = facts.calling_thread_only and self.on_cpu
        self.threads = 1 if self.calling_thread_only else int(os.environ.get("TVM_NUM_THREADS") or 1)
        self.thread_switches: list[dict[str, Any]] = []  # the stall fallback's switches, for Session.events
        self._limits = self._stall_limits(facts) if dispatch and self.on_cpu else {}

    def _stall_limits(self, facts: TvmFacts) -> dict[ShapeKey, float]:
        """Per tuned shape where compile's pool clearly beat one thread: one thread's latency there (the pool is
        watched only at the thread count compile measured, and only when RLOPT_TVM_STALL_FALLBACK=1)."""
        if self.threads <= 1 or self.threads != facts.num_threads or not fallback_enabled():
            return {}
        limits = {}
        for build in facts.shape_builds:
            key = build.key(self.input_names)
            limit = watch_limit_us(facts.thread_latency_us.get(shape_label(key), {}), self.threads)
            if limit is not None:
                limits[key] = limit
        return limits

    def events(self) -> list[dict[str, Any]]:
        return list(self.thread_switches)

    def _stalled(self, bucket: ShapeKey, guard: StallGuard) -> None:
        """Calls at `bucket` kept running slower than one thread would: this thread's pool goes to one thread."""
        if not one_thread_pool():
            return
        event = {"event": "tvm pool re-sized to 1 thread", "threads_before": self.threads, "shape": shape_label(bucket),
                 "one_thread_us": round(guard.limit_ns / 1e3, 2), "thread": threading.current_thread().name}
        self.thread_switches.append(event)
        logging.getLogger("rlopt").warning(
            "TVM: most calls at %s took longer than one thread's %.0f us (a busy core stalls the %d-thread pool): "
            "this thread's pool now runs 1 thread", event["shape"], event["one_thread_us"], self.threads)

    def _load(self, path: Path) -> Any:
        try:
            return self.tvm.runtime.load_module(str(path))
        except Exception as exc:  # tvm raises TVMError subclasses of its own for a bad .so
            raise ArtifactError(located(path, "", f"TVM cannot load it ({str(exc).splitlines()[0]})",
                                        "recompile MODEL_DIR")) from None

    def _bind_params(self, path: Path, facts: TvmFacts, names: dict[ShapeKey | None, list[str]]
                     ) -> dict[ShapeKey | None, list[Any]]:
        """Each library's transformed weights (its `main` arguments after the inputs), made once here and shared
        by every thread; none for libraries with the weights baked in."""
        from rlopt.backends.tvm.params import bind_params, read_params

        if facts.params is None:
            return {key: [] for key in self._libraries}
        params_path = checked_sibling(path, facts.params.file)
        try:
            weights = read_params(params_path)
            return {key: bind_params(self.tvm, self._vm.VirtualMachine(lib, self.device), names[key], weights,
                                     self.device) for key, lib in self._libraries.items()}
        except Exception as exc:  # a bad file or a library that disagrees with it: numpy, zipfile and TVM errors
            raise ArtifactError(located(params_path, "", f"TVM weights do not load ({first_line(exc)})",
                                        "recompile MODEL_DIR")) from None

    @property
    def shape_buckets(self) -> list[ShapeKey]:
        return [key for key in self._libraries if key is not None]

    def _thread_state(self) -> Any:
        state = self._local
        if not hasattr(state, "plans"):
            # this thread's pool as this runner runs it: another runner (or the build's thread choice) may have sized it
            sized = thread_pool_size()
            if self.on_cpu and (self.calling_thread_only or (sized is not None and sized != self.threads)):
                size_thread_pool(self.threads)
            state.vms = {key: self._vm.VirtualMachine(lib, self.device) for key, lib in self._libraries.items()}
            state.functions = {key: _with_params(vm["main"], self._params[key]) for key, vm in state.vms.items()}
            state.plans = {}
            state.dynamic_plans = {}
            state.padded_plans = {}
            state.padded_buckets = {}
            state.guards = {}
        return state

    def staging(self, array: np.ndarray) -> tuple[np.ndarray, Any]:
        """A 64-byte-aligned array like `array` and its TVM view, made once per thread and shape."""
        raw = np.empty(array.nbytes + ALIGNMENT, dtype=np.uint8)
        offset = (-raw.ctypes.data) % ALIGNMENT
        buffer = raw[offset:offset + array.nbytes].view(array.dtype).reshape(array.shape)
        return buffer, self.from_dlpack(buffer, require_alignment=ALIGNMENT)

    def _first_call(self, arrays: list[np.ndarray], dispatch: bool) -> list[np.ndarray]:
        """Work out (and keep, per thread) how to call this signature: a KernelChain for a shape with its own
        static build when the chain can be recorded, else the VM."""
        state = self._thread_state()
        plans = state.plans if dispatch else state.dynamic_plans
        key = tuple([(a.shape, a.dtype) for a in arrays])
        shapes = tuple(a.shape for a in arrays)
        bucket = shapes if dispatch and shapes in self._libraries else None
        small = [self.on_cpu and a.nbytes <= _chain.STAGE_BYTES for a in arrays]
        if bucket is not None and self.on_cpu:
            staging = [self.staging(a) for a in arrays]
            for (buffer, _), array in zip(staging, arrays):
                np.copyto(buffer, array)
            vm = self._vm.VirtualMachine(self._libraries[bucket], self.device)
            chain, results = record_chain(vm, staging, self.from_dlpack, self._params[bucket])
            # a refused chain still computed this call's outputs; the VM serves the calls after it
            plan: Any = chain if chain is not None else VmCall(
                state.functions[bucket], [st if fits else None for st, fits in zip(staging, small)], small, self)
            limit = self._limits.get(bucket)
            if limit is not None:
                guard = StallGuard(limit, lambda g, b=bucket: self._stalled(b, g))
                state.guards[key] = (plan, guard)
                plan = timed(plan, guard)
            plans[key] = plan
            return results
        if bucket is None and dispatch and self.pads:
            padded = self._padded_call(shapes, [a.dtype for a in arrays], strict=False)
            if padded is not None:
                plans[key] = padded
                return padded(arrays)
        plan = plans[key] = VmCall(state.functions[bucket], [self.staging(a) if fits else None
                                                             for a, fits in zip(arrays, small)], small, self)
        return plan(arrays)

    def _padded_call(self, shapes: ShapeKey, dtypes: list[Any], *, strict: bool) -> PaddedCall | None:
        """A call that pads `shapes` into the smallest bigger build, or None (no such build, or its VM cannot be
        replayed as a chain)."""
        assert self.padding is not None
        target = self.padding.bucket_for(shapes, self.shape_buckets, strict=strict)
        if target is None:
            return None
        state = self._thread_state()
        if target not in state.padded_buckets:
            staging = [self.staging(np.empty(dims, dtype=dtype)) for dims, dtype in zip(target, dtypes)]
            for buffer, _ in staging:
                buffer.fill(0)
            chain, _ = record_chain(self._vm.VirtualMachine(self._libraries[target], self.device), staging,
                                    self.from_dlpack, self._params[target], elide=False)  # its zeros must stay
            state.padded_buckets[target] = None if chain is None else PaddedBucket(chain)
        bucket = state.padded_buckets[target]
        return None if bucket is None else PaddedCall(bucket, shapes, self.padding.cuts(shapes))

    def infer_ordered(self, arrays: Sequence[np.ndarray], signature: tuple[Any, ...] | None = None) -> list[np.ndarray]:
        """`infer` with the inputs already in input order; `signature` is their ((shape, dtype), ...) when the
        caller has it (Session's fast path does)."""
        plans = getattr(self._local, "plans", None)
        if plans is not None:
            plan = plans.get(signature if signature is not None else tuple([(a.shape, a.dtype) for a in arrays]))
            if plan is not None:
                return plan(arrays)
        return self._first_call(arrays, dispatch=True)

    def bound_call(self, signature: tuple[Any, ...], output_names: list[str]) -> BoundCall | None:
        """This thread's plan for `signature` as one function to named outputs (a KernelChain's `bind`, timed for
        the stall fallback where the pool is watched), or None."""
        guarded = getattr(self._local, "guards", {}).get(signature)
        if guarded is not None:
            chain, guard = guarded
            bound = chain.bind(output_names) if isinstance(chain, KernelChain) else None
            return timed(bound, guard) if bound is not None else None
        plan = getattr(self._local, "plans", {}).get(signature)
        return plan.bind(output_names) if isinstance(plan, KernelChain) else None

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self.infer_ordered([feeds[name] for name in self.input_names])

    def infer_dynamic(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Always the dynamic library: what serves shapes without a bucket (verified on its own at compile time)."""
        arrays = [feeds[name] for name in self.input_names]
        plans = getattr(self._local, "dynamic_plans", None)
        plan = plans.get(tuple([(a.shape, a.dtype) for a in arrays])) if plans is not None else None
        return plan(arrays) if plan is not None else self._first_call(arrays, dispatch=False)

    def infer_padded(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        """Padded into the smallest strictly bigger build (the largest shape runs its own build): the path shapes
        without their own build take once the parity gate has passed it."""
        arrays = [feeds[name] for name in self.input_names]
        key = tuple([(a.shape, a.dtype) for a in arrays])
        plans = self._thread_state().padded_plans
        if key not in plans:
            padded = self._padded_call(tuple(a.shape for a in arrays), [a.dtype for a in arrays], strict=True)
            plans[key] = padded if padded is not None else (lambda ordered: self.infer_ordered(ordered))
        return plans[key](arrays)  # type: ignore[no-any-return]

    def parity_variants(self) -> dict[str, Callable[[dict[str, np.ndarray]], list[np.ndarray]]]:
        """Code paths `infer` may not exercise on the reference shapes, for the parity gate to check too."""
        return {"dynamic": self.infer_dynamic} if self.shape_buckets else {}

    def gated_variants(self) -> dict[str, Callable[[dict[str, np.ndarray]], list[np.ndarray]]]:
        """Tricks the runtime uses only once the parity gate has passed them (facts.variant_parity.<name>): a
        failure turns the trick off, not the artifact."""
        return {"padded": self.infer_padded} if self.padding is not None else {}

    def close(self) -> None:
        self._libraries = {}
        self._params = {}
        self._local = threading.local()
