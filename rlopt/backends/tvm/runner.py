"""TVM runner: exact-shape dispatch to tuned static builds, the dynamic build for every other shape, a lean call.

Why the call path looks like this (measured on the tuned [1,1,768] policy, kernels ~11 us):
- `tvm.runtime.tensor(np)` copies and costs ~20 us; `from_dlpack` wraps the numpy buffer in
  ~0.6 us. Kernels may use aligned vector loads, so only 64-byte-aligned arrays are wrapped;
  others are copied into a preallocated aligned buffer (~1 us), never a fresh allocation.
- `out.numpy()` copies (13 us for two outputs); `np.from_dlpack(out)` hands the VM's fresh
  output buffer to numpy without a copy.
- The VM function is looked up once; each thread gets its own VM (a VM is not re-entrant).
- A tuned static build is called as a `KernelChain`: its kernels in the order the VM called them, on the
  buffers the VM allocated, with no VM, no output allocation and no tuple unpacking per call (VM call 3.3 us
  vs its three kernels 1.0 us on the PPO actor at [1,17]; unpacking a tuple result cost another 2.6 us).
- TVM's thread count (chosen by measurement at compile time) is set through TVM_NUM_THREADS
  before TVM first starts its pool; a user's own TVM_NUM_THREADS wins.
"""

from __future__ import annotations

import os
import threading
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, Callable

import numpy as np

from rlopt.backends.base import Runner
from rlopt.errors import ArtifactError, BackendUnavailable, located
from rlopt.lazy import require
from rlopt.backends.base import flatten_outputs

ALIGNMENT = 64
STAGE_BYTES = 64 * 1024
ShapeKey = tuple[tuple[int, ...], ...]


# Builtins a static build's VM may call without making its kernel sequence depend on data: checks, allocation,
# views and tuple plumbing. Anything else (an If's condition, a copy, a call into another device) keeps the VM.
CHECK_BUILTINS = frozenset({"vm.builtin.check_tensor_info", "vm.builtin.match_shape"})
CHAIN_BUILTINS = CHECK_BUILTINS | {"vm.builtin.alloc_storage", "vm.builtin.alloc_tensor", "vm.builtin.null_value",
                                   "vm.builtin.tuple_getitem", "vm.builtin.make_tuple", "vm.builtin.reshape"}


@dataclass
class KernelChain:
    """A static build replayed without its VM: the kernels it called, in order, on the tensors it allocated.

    Exact because a static build whose VM calls only CHAIN_BUILTINS runs the same kernels on the same buffers
    every call; the buffers stay alive while the chain holds them. Inputs are copied into the recorded staging
    buffers, except a large aligned input that only kernels read, which is passed in place of the recorded one.
    Outputs are copied out, since the next call overwrites the buffers.
    """

    calls: list[tuple[Any, tuple[Any, ...], tuple[tuple[int, int], ...]]] = field(repr=False)
    staging: list[tuple[np.ndarray, Any]] = field(repr=False)
    replaceable: list[bool]
    outputs: list[np.ndarray] = field(repr=False)
    from_dlpack: Callable[..., Any] = field(repr=False)
    recorder: Any = field(repr=False)

    def __post_init__(self) -> None:
        self._buffers = [buffer for buffer, _ in self.staging]
        self._plain = [(function, args) for function, args, _ in self.calls]
        # which inputs may be read in place is fixed by their size: a chain is recorded for one shape
        self._in_place = [r and buffer.nbytes > STAGE_BYTES for r, buffer in zip(self.replaceable, self._buffers)]
        self._any_in_place = any(self._in_place)

    @property
    def buffers(self) -> list[np.ndarray]:
        """The staging buffers the kernels read the inputs from."""
        return self._buffers

    def run_staged(self) -> list[np.ndarray]:
        """Run the kernels on what the staging buffers hold now; the results are the chain's own buffers."""
        for function, args in self._plain:
            function(*args)
        return self.outputs

    def bind(self, output_names: list[str]) -> Callable[[list[np.ndarray]], dict[str, np.ndarray]] | None:
        """This chain as one generated function from the inputs (in order) to the named outputs, or None when an
        input may be read in place. Straight-line code with every argument bound by name: the PPO actor's three
        kernels at [1,17] cost 1.4 us so against 1.9 us through `__call__`'s loops and tuple unpacking."""
        if self._any_in_place or len(output_names) != len(self.outputs):
            return None
        namespace: dict[str, Any] = {"copyto": np.copyto}
        lines = ["def call(arrays):"]
        for i, buffer in enumerate(self._buffers):
            namespace[f"b{i}"] = buffer
            lines.append(f"    copyto(b{i}, arrays[{i}])")
        for j, (function, args) in enumerate(self._plain):
            namespace[f"f{j}"] = function
            namespace.update({f"a{j}_{k}": arg for k, arg in enumerate(args)})
            lines.append(f"    f{j}({', '.join(f'a{j}_{k}' for k in range(len(args)))})")
        namespace.update({f"o{k}": output for k, output in enumerate(self.outputs)})
        namespace.update({f"n{k}": name for k, name in enumerate(output_names)})
        lines.append("    return {" + ", ".join(f"n{k}: o{k}.copy()" for k in range(len(self.outputs))) + "}")
        exec("\n".join(lines), namespace)  # the source holds only generated names; every value is bound above
        return namespace["call"]  # type: ignore[no-any-return]

    def __call__(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        if not self._any_in_place:
            for buffer, array in zip(self._buffers, arrays):
                np.copyto(buffer, array)
            return [output.copy() for output in self.run_staged()]
        replaced: dict[int, Any] = {}
        for slot, array in enumerate(arrays):
            if self._in_place[slot] and array.flags.c_contiguous:
                tensor = self.from_dlpack(array, require_contiguous=True)
                if tensor.data_ptr() % ALIGNMENT == 0:
                    replaced[slot] = tensor
                    continue
            np.copyto(self._buffers[slot], array)
        for function, args, reads in self.calls:
            function(*(_swap(args, reads, replaced) if reads and replaced else args))
        return [output.copy() for output in self.outputs]


def _swap(args: tuple[Any, ...], reads: tuple[tuple[int, int], ...], replaced: dict[int, Any]) -> list[Any]:
    swapped = list(args)
    for position, slot in reads:
        if slot in replaced:
            swapped[position] = replaced[slot]
    return swapped


def record_chain(vm: Any, staging: list[tuple[np.ndarray, Any]],
                 from_dlpack: Callable[..., Any]) -> tuple[KernelChain | None, list[np.ndarray]]:
    """Run `vm` once on the staged inputs, watching every call; the chain (None when the VM did anything a replay
    cannot repeat) and this call's outputs."""
    trace: list[tuple[str, Any, tuple[Any, ...]]] = []

    def watch(function: Any, symbol: str, before_run: bool, _result: Any, *args: Any) -> int:
        if before_run:
            trace.append((symbol, function, args))
        return 0  # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(watch)
    inputs = [tensor for _, tensor in staging]
    outputs = flatten_outputs(vm["main"](*inputs))
    results = [np.from_dlpack(t).copy() for t in outputs]
    if not all(hasattr(t, "data_ptr") for t in outputs):
        return None, results
    pointers = [t.data_ptr() for t in inputs]
    replaceable = [p not in {t.data_ptr() for t in outputs} for p in pointers]
    calls = []
    for symbol, function, args in trace:
        reads = tuple((position, slot) for position, arg in enumerate(args) if hasattr(arg, "data_ptr")
                      for slot, pointer in enumerate(pointers) if arg.data_ptr() == pointer)
        if "." not in symbol:
            calls.append((function, args, reads))
        elif symbol not in CHAIN_BUILTINS:
            return None, results
        elif symbol not in CHECK_BUILTINS:
            for _, slot in reads:  # a view of an input stays valid only on the staged buffer
                replaceable[slot] = False
    return KernelChain(calls, staging, replaceable, [np.from_dlpack(t) for t in outputs], from_dlpack, vm), results


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


Follow = tuple[int, int]  # (input slot, dim)


@dataclass(frozen=True)
class PaddingPlan:
    """Along which input dims a shape may be zero-padded up to a bigger static build, and how to cut the outputs.

    Read off the static builds: an output dim follows an input dim when it equals it in every build and that input
    dim varies across builds (a batch or sequence dim); a varying input dim no output follows (one reduced away)
    is never padded. Rows padded with zeros leave the real rows unchanged only if the network treats rows
    independently, which this plan cannot know: the runtime pads only after the parity gate passed the `padded`
    variant (facts.variant_parity.padded), which pads each reference shape into a bigger build.
    """

    paddable: frozenset[Follow]
    follows: tuple[tuple[Follow | None, ...], ...]
    varying: frozenset[Follow]

    @property
    def covers_range(self) -> bool:
        """Every varying dim can be padded, so the largest build serves every shape up to it."""
        return self.varying <= self.paddable

    def bucket_for(self, shapes: ShapeKey, buckets: list[ShapeKey], *, strict: bool = False) -> ShapeKey | None:
        """The smallest build `shapes` pads into (equal on the other dims); with `strict`, never `shapes` itself."""
        def fits(bucket: ShapeKey) -> bool:
            return all(len(b) == len(s) and all(bd == sd or ((slot, d) in self.paddable and bd > sd)
                                                for d, (bd, sd) in enumerate(zip(b, s)))
                       for slot, (b, s) in enumerate(zip(bucket, shapes)))

        fitting = [b for b in buckets if len(b) == len(shapes) and fits(b) and not (strict and b == shapes)]
        return min(fitting, key=lambda b: sum(int(np.prod(dims)) for dims in b)) if fitting else None

    def cuts(self, shapes: ShapeKey) -> list[tuple[slice, ...]]:
        """Per output, the slice that holds the rows of an input of `shapes`."""
        return [tuple(slice(None) if f is None else slice(0, shapes[f[0]][f[1]]) for f in dims)
                for dims in self.follows]


def padding_plan(builds: list[dict[str, Any]], names: list[str]) -> PaddingPlan | None:
    """The PaddingPlan the static builds allow (each lists its `shapes` and `output_shapes`), or None."""
    if len(builds) < 2 or any(not b.get("output_shapes") for b in builds):
        return None
    ins = [[list(b["shapes"][n]) for n in names] for b in builds]
    outs = [b["output_shapes"] for b in builds]
    if len({len(o) for o in outs}) != 1:
        return None
    varying = {(slot, d) for slot in range(len(names)) for d in range(len(ins[0][slot]))
               if len({len(shape[slot]) for shape in ins}) == 1 and len({shape[slot][d] for shape in ins}) > 1}
    follows: list[tuple[Follow | None, ...]] = []
    for k, first in enumerate(outs[0]):
        if len({len(o[k]) for o in outs}) != 1:
            return None
        dims: list[Follow | None] = []
        for d in range(len(first)):
            values = [o[k][d] for o in outs]
            if len(set(values)) == 1:
                dims.append(None)
                continue
            matches = [f for f in sorted(varying) if [shape[f[0]][f[1]] for shape in ins] == values]
            if len(matches) != 1:  # an output dim no input dim explains, or two that do: cannot cut it back
                return None
            dims.append(matches[0])
        follows.append(tuple(dims))
    paddable = frozenset(f for dims in follows for f in dims if f is not None)
    return PaddingPlan(paddable, tuple(follows), frozenset(varying)) if paddable else None


@dataclass
class PaddedBucket:
    """A static build's chain used for smaller shapes; `corner` = whose data its zeroed buffers now hold."""

    chain: KernelChain
    corner: ShapeKey | None = None


class PaddedCall:
    """A shape without its own build, run in a bigger build: written into the leading corner of its zeroed input
    buffers, outputs cut back to the real rows."""

    def __init__(self, bucket: PaddedBucket, shapes: ShapeKey, cuts: list[tuple[slice, ...]]) -> None:
        self.bucket, self.shapes = bucket, shapes
        self.views = [buffer[tuple(slice(0, n) for n in shape)] for buffer, shape in zip(bucket.chain.buffers, shapes)]
        self.results = [output[cut] for output, cut in zip(bucket.chain.outputs, cuts)]

    def __call__(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        bucket = self.bucket
        if bucket.corner != self.shapes:  # another shape used this build last: its rows must not stay
            for buffer in bucket.chain.buffers:
                buffer.fill(0)
            bucket.corner = self.shapes
        for view, array in zip(self.views, arrays):
            np.copyto(view, array)
        bucket.chain.run_staged()
        return [result.copy() for result in self.results]


def gate_passed(facts: dict[str, Any], variant: str) -> bool:
    """Whether compile's parity gate passed `variant` of an artifact (facts.variant_parity.<variant>)."""
    return bool(facts.get("variant_parity", {}).get(variant, {}).get("passed"))


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


class TvmRunner(Runner):
    """One dynamic library plus zero or more exact-shape libraries, all checked before they are loaded."""

    def __init__(self, path: Path, input_names: list[str], facts: dict[str, Any], *, dispatch: bool = True) -> None:
        from rlopt.backends.tvm.cpu_features import missing_features

        target = facts.get("target", {})
        if target.get("kind") == "llvm":
            lacking = missing_features(list(facts.get("cpu_features", [])))
            if lacking:
                raise BackendUnavailable(f"TVM library built for mcpu '{target.get('mcpu')}' needs CPU features "
                                         f"this CPU lacks ({', '.join(lacking[:6])}); fix: recompile on this machine")
        # TVM reads this once, when its thread pool first starts (default here: half the cores, i.e. 1);
        # configuring the pool later would pin the calling thread to one core, so it is never done.
        os.environ.setdefault("TVM_NUM_THREADS", str(int(facts.get("num_threads") or os.cpu_count() or 1)))
        self.tvm = require("tvm")
        self._relax = require("tvm.relax")
        self.from_dlpack = require("tvm_ffi").from_dlpack
        self.device = self.tvm.cuda(0) if target.get("kind") == "cuda" else self.tvm.cpu(0)
        if target.get("kind") == "cuda" and not self.device.exist:
            raise BackendUnavailable("TVM library targets CUDA but no CUDA device is present here")
        self.input_names = input_names
        self.on_cpu = target.get("kind") != "cuda"
        self._libraries: dict[ShapeKey | None, Any] = {None: self._load(path)}
        if dispatch:
            for build in facts.get("shape_builds", []):
                shapes = build.get("shapes", {})
                key = tuple(tuple(int(d) for d in shapes[name]) for name in input_names)
                self._libraries[key] = self._load(checked_sibling(path, build["file"]))
        self.padding = padding_plan(facts.get("shape_builds", []), input_names) if self.on_cpu and dispatch else None
        self.pads = self.padding is not None and gate_passed(facts, "padded")
        self._local = threading.local()

    def _load(self, path: Path) -> Any:
        try:
            return self.tvm.runtime.load_module(str(path))
        except Exception as exc:  # tvm raises TVMError subclasses of its own for a bad .so
            raise ArtifactError(located(path, "", f"TVM cannot load it ({str(exc).splitlines()[0]})",
                                        "recompile MODEL_DIR")) from None

    @property
    def shape_buckets(self) -> list[ShapeKey]:
        return [key for key in self._libraries if key is not None]

    def _thread_state(self) -> Any:
        state = self._local
        if not hasattr(state, "plans"):
            state.vms = {key: self._relax.VirtualMachine(lib, self.device) for key, lib in self._libraries.items()}
            state.functions = {key: vm["main"] for key, vm in state.vms.items()}
            state.plans = {}
            state.dynamic_plans = {}
            state.padded_plans = {}
            state.padded_buckets = {}
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
        small = [self.on_cpu and a.nbytes <= STAGE_BYTES for a in arrays]
        if bucket is not None and self.on_cpu:
            staging = [self.staging(a) for a in arrays]
            for (buffer, _), array in zip(staging, arrays):
                np.copyto(buffer, array)
            vm = self._relax.VirtualMachine(self._libraries[bucket], self.device)
            chain, results = record_chain(vm, staging, self.from_dlpack)
            # a refused chain still computed this call's outputs; the VM serves the calls after it
            plans[key] = chain if chain is not None else VmCall(
                state.functions[bucket], [st if fits else None for st, fits in zip(staging, small)], small, self)
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
            chain, _ = record_chain(self._relax.VirtualMachine(self._libraries[target], self.device), staging,
                                    self.from_dlpack)
            state.padded_buckets[target] = None if chain is None else PaddedBucket(chain)
        bucket = state.padded_buckets[target]
        return None if bucket is None else PaddedCall(bucket, shapes, self.padding.cuts(shapes))

    def infer_ordered(self, arrays: list[np.ndarray], signature: tuple[Any, ...] | None = None) -> list[np.ndarray]:
        """`infer` with the inputs already in input order; `signature` is their ((shape, dtype), ...) when the
        caller has it (Session's fast path does)."""
        plans = getattr(self._local, "plans", None)
        if plans is not None:
            plan = plans.get(signature if signature is not None else tuple([(a.shape, a.dtype) for a in arrays]))
            if plan is not None:
                return plan(arrays)
        return self._first_call(arrays, dispatch=True)

    def bound_call(self, signature: tuple[Any, ...],
                   output_names: list[str]) -> Callable[[list[np.ndarray]], dict[str, np.ndarray]] | None:
        """This thread's plan for `signature` as one function to named outputs (a KernelChain's `bind`), or None."""
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
        self._local = threading.local()
