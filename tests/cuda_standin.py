"""A torch whose CUDA device is this CPU, for the GPU runners' CPU-side logic, refusing what CUDA refuses.

`make_cuda_torch()` returns a module that is the real torch except for `torch.cuda` and `torch.empty`:
- "device" memory is host memory (TensorRT's stand-in reads and writes it at its addresses); every `empty` is
  recorded in `torch._allocations` as (device, pinned, elements); pinning a device tensor raises as CUDA does;
- streams are objects with a `cuda_stream` handle; `torch.cuda.stream(s)` makes `s` current for the thread;
- a `CUDAGraph` captured under `torch.cuda.graph(g)` records every aten op of the captured call (through a
  TorchDispatchMode, which sees the ops TorchScript runs) and `replay()` re-runs them on the same tensors, writing
  each result into the tensor the capture produced: the static-buffer semantics of a real graph. A host
  synchronisation during capture (`.item()`, `nonzero`) raises as CUDA's stream capture does, and two threads
  replaying one graph at once raise (on a GPU they would race on its buffers).
"""

from __future__ import annotations

import threading
import time
import types
from contextlib import contextmanager
from typing import Any, Iterator

import torch as real_torch
from torch.utils._python_dispatch import TorchDispatchMode

CAPTURE_REFUSES = {"aten._local_scalar_dense.default", "aten.nonzero.default", "aten.item.default"}
NOT_PERMITTED = "CUDA error: operation not permitted when stream is capturing"


class _Recorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[tuple[Any, tuple, dict, Any]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if str(func) in CAPTURE_REFUSES:
            raise RuntimeError(NOT_PERMITTED)
        out = func(*args, **(kwargs or {}))
        self.ops.append((func, args, kwargs or {}, out))
        return out


class CUDAGraph:
    def __init__(self) -> None:
        self._ops: list[tuple[Any, tuple, dict, Any]] = []
        self._replaying = threading.Lock()
        self.replays = 0

    def replay(self) -> None:
        if not self._replaying.acquire(blocking=False):
            raise RuntimeError("one CUDA graph replayed by two threads at once (its static buffers would race)")
        try:
            time.sleep(0.001)
            with real_torch.no_grad():
                for func, args, kwargs, out in self._ops:
                    fresh = func(*args, **kwargs)
                    for old, new in zip(_tensors(out), _tensors(fresh)):
                        if old is not new:
                            old.copy_(new)
            self.replays += 1
        finally:
            self._replaying.release()


def _tensors(value: Any) -> list[Any]:
    if isinstance(value, real_torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for item in value for t in _tensors(item)]
    return []


class Stream:
    _handles = iter(range(1000, 10**9))

    def __init__(self) -> None:
        self.cuda_stream = next(Stream._handles)
        self.synchronized = 0

    def synchronize(self) -> None:
        self.synchronized += 1

    def wait_stream(self, other: Stream) -> None:
        pass


class _Cuda:
    """torch.cuda's slice the runners use."""

    CUDAGraph = CUDAGraph
    Stream = Stream

    def __init__(self) -> None:
        self._local = threading.local()
        self._default = Stream()

    def is_available(self) -> bool:
        return True

    def current_stream(self) -> Stream:
        return getattr(self._local, "stream", self._default)

    @contextmanager
    def stream(self, stream: Stream) -> Iterator[None]:
        previous = self.current_stream()
        self._local.stream = stream
        try:
            yield
        finally:
            self._local.stream = previous

    @contextmanager
    def graph(self, cuda_graph: CUDAGraph, pool: Any = None, stream: Stream | None = None) -> Iterator[None]:
        recorder = _Recorder()
        with recorder:
            yield
        cuda_graph._ops = recorder.ops

    def synchronize(self) -> None:
        pass


class FakeCudaTorch(types.ModuleType):
    """The real torch, with `cuda` and `empty` replaced."""

    def __init__(self) -> None:
        super().__init__("torch")
        self.cuda = _Cuda()
        self._allocations: list[tuple[str, bool, int]] = []

    def empty(self, *size: Any, dtype: Any = None, device: Any = None, pin_memory: bool = False) -> Any:
        shape = tuple(size[0]) if len(size) == 1 and isinstance(size[0], (tuple, list)) else tuple(size)
        where = str(device or "cpu")
        if pin_memory and where.startswith("cuda"):
            raise RuntimeError("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned")
        tensor = real_torch.empty(shape, dtype=dtype)
        self._allocations.append((where, pin_memory, tensor.numel()))
        return tensor

    def __getattr__(self, name: str) -> Any:
        return getattr(real_torch, name)


def make_cuda_torch() -> FakeCudaTorch:
    return FakeCudaTorch()
