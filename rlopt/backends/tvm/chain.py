"""A tuned static build called without its VM: `KernelChain`, recorded once per thread by `record_chain`.

Why the call path looks like this (measured on the tuned [1,1,768] policy, kernels ~11 us):
- `tvm.runtime.tensor(np)` copies and costs ~20 us; `from_dlpack` wraps the numpy buffer in
  ~0.6 us. Kernels may use aligned vector loads, so only 64-byte-aligned arrays are wrapped;
  others are copied into a preallocated aligned buffer (~1 us), never a fresh allocation.
- `out.numpy()` copies (13 us for two outputs); `np.from_dlpack(out)` hands the VM's fresh
  output buffer to numpy without a copy.
- A tuned static build is called as a `KernelChain`: its kernels in the order the VM called them, on the
  buffers the VM allocated, with no VM, no output allocation and no tuple unpacking per call (VM call 3.3 us
  vs its three kernels 1.0 us on the PPO actor at [1,17]; unpacking a tuple result cost another 2.6 us).
- Each kernel call costs ~0.2 us of dispatch, so a leading or trailing kernel that only re-lays bytes (the
  default policy's `obs[0]` take and its `unsqueeze` at batch 1) is not called: the input is copied straight
  into its output, or the output read straight from its input (`elide_layout_copies`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from rlopt.backends.base import BoundCall, flatten_outputs

ALIGNMENT = 64
STAGE_BYTES = 64 * 1024
# Kernels Relax legalizes from ops that only re-lay a row-major buffer: with as many elements in as out, the output
# holds the input's bytes unchanged. Symbols carry a numeric suffix. A `take` qualifies only with one index (then
# the axis it indexes has length 1): with as many indices as the axis is long it may permute.
LAYOUT_KERNELS = frozenset({"reshape", "expand_dims", "squeeze", "flatten", "take"})


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
    symbols: list[str] = field(default_factory=list)  # each call's kernel, for diagnostics (scripts/bench_callpath.py)

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

    def bind(self, output_names: list[str]) -> BoundCall | None:
        """This chain as one generated function from the inputs (in order; the feeds dict is not read) to the named
        outputs, or None when an input may be read in place. Straight-line code with every argument bound by name: the PPO actor's three
        kernels at [1,17] cost 1.4 us so against 1.9 us through `__call__`'s loops and tuple unpacking."""
        if self._any_in_place or len(output_names) != len(self.outputs):
            return None
        namespace: dict[str, Any] = {}
        lines = ["def call(feeds, arrays):"]
        for i, buffer in enumerate(self._buffers):
            namespace[f"b{i}"] = buffer
            lines.append(f"    b{i}[...] = arrays[{i}]")  # same shape and dtype: 0.1-0.4 us under np.copyto
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


def record_chain(vm: Any, staging: list[tuple[np.ndarray, Any]], from_dlpack: Callable[..., Any],
                 params: list[Any] | tuple[Any, ...] = (), *, elide: bool = True
                 ) -> tuple[KernelChain | None, list[np.ndarray]]:
    """Run `vm` once on the staged inputs (then `params`, the library's transformed weights), watching every call;
    the chain (None when the VM did anything a replay cannot repeat) and this call's outputs. The chain's kernels
    keep reading the weight tensors they were recorded with. `elide`: drop layout-only kernels at either end
    (`elide_layout_copies`); off for a chain whose staging buffers must keep their contents between calls."""
    trace: list[tuple[str, Any, tuple[Any, ...]]] = []

    def watch(function: Any, symbol: str, before_run: bool, _result: Any, *args: Any) -> int:
        if before_run:
            trace.append((symbol, function, args))
        return 0  # VMInstrumentReturnKind.NO_OP

    vm.set_instrument(watch)
    inputs = [tensor for _, tensor in staging]
    outputs = flatten_outputs(vm["main"](*inputs, *params))
    results = [np.from_dlpack(t).copy() for t in outputs]
    if not all(hasattr(t, "data_ptr") for t in outputs):
        return None, results
    pointers = [t.data_ptr() for t in inputs]
    replaceable = [p not in {t.data_ptr() for t in outputs} for p in pointers]
    calls, symbols = [], []
    for symbol, function, args in trace:
        reads = tuple((position, slot) for position, arg in enumerate(args) if hasattr(arg, "data_ptr")
                      for slot, pointer in enumerate(pointers) if arg.data_ptr() == pointer)
        if "." not in symbol:
            calls.append((function, args, reads))
            symbols.append(symbol)
        elif symbol not in CHAIN_BUILTINS:
            return None, results
        elif symbol not in CHECK_BUILTINS:
            for _, slot in reads:  # a view of an input stays valid only on the staged buffer
                replaceable[slot] = False
    staged, arrays = list(staging), [np.from_dlpack(t) for t in outputs]
    if elide:
        staged, arrays = elide_layout_copies(calls, symbols, staged, replaceable, arrays)
    return KernelChain(calls, staged, replaceable, arrays, from_dlpack, vm, symbols), results


def _layout_copy(symbol: str, args: tuple[Any, ...]) -> bool:
    """A kernel whose last argument receives its first one's bytes unchanged (see LAYOUT_KERNELS)."""
    kind = symbol.rstrip("0123456789")
    if kind not in LAYOUT_KERNELS or len(args) != (3 if kind == "take" else 2):
        return False
    if not all(hasattr(arg, "data_ptr") for arg in args):
        return False
    source, target = args[0], args[-1]
    if kind == "take" and int(np.prod(args[1].shape)) != 1:  # (data, indices, out)
        return False
    return source.dtype == target.dtype and int(np.prod(source.shape)) == int(np.prod(target.shape))


def elide_layout_copies(calls: list[Any], symbols: list[str], staging: list[tuple[np.ndarray, Any]],
                        replaceable: list[bool], outputs: list[np.ndarray]
                        ) -> tuple[list[tuple[np.ndarray, Any]], list[np.ndarray]]:
    """Drop (in place, from `calls` and `symbols`) a first kernel that only re-lays one staged input, and trailing
    kernels that only re-lay a result into an output; the staging and outputs that replace them.

    A dropped first kernel's output becomes that input's staging buffer (viewed in the input's shape): each call
    copies the whole input there, and the input is no longer read in place (no kernel reads its old buffer). A
    later kernel may reuse that memory, so a chain whose staging buffers must keep their contents between calls (a
    padded bucket's zeros) is recorded without elision. A dropped last kernel's output is read from its input
    instead (viewed in the output's shape): no kernel runs after it, so that input holds its final value.
    """
    if calls and _layout_copy(symbols[0], calls[0][1]):
        args, reads = calls[0][1], calls[0][2]
        slot = reads[0][1] if len(reads) == 1 and reads[0][0] == 0 else None
        target = args[-1]
        if (slot is not None and replaceable[slot] and all(slot not in {s for _, s in call[2]} for call in calls[1:])
                and not any(o.ctypes.data == target.data_ptr() for o in outputs)):
            shape = staging[slot][0].shape
            staging[slot] = (np.from_dlpack(target).reshape(shape), target)
            replaceable[slot] = False
            del calls[0], symbols[0]
    while calls and _layout_copy(symbols[-1], calls[-1][1]) and not calls[-1][2]:
        args = calls[-1][1]
        source, target = args[0], args[-1]
        slots = [k for k, o in enumerate(outputs) if o.ctypes.data == target.data_ptr()]
        if len(slots) != 1 or any(o.ctypes.data == source.data_ptr() for o in outputs):
            break
        outputs[slots[0]] = np.from_dlpack(source).reshape(outputs[slots[0]].shape)
        del calls[-1], symbols[-1]
    return staging, outputs


__all__ = ["ALIGNMENT", "CHAIN_BUILTINS", "CHECK_BUILTINS", "LAYOUT_KERNELS", "STAGE_BYTES", "KernelChain",
           "elide_layout_copies", "record_chain"]
