"""One CUDA graph of the scripted module per named shape, on static buffers, replayed under a lock.

A CUDA graph records the kernels of one call at fixed device addresses; replaying it reruns them on whatever the
static input buffers hold and leaves the results in the static output buffers. So a replay copies the caller's
arrays into pinned host buffers, then into the static inputs on the graph's own stream, replays, copies the
outputs back on the same stream, synchronizes once and returns copies. The buffers belong to the graph: one lock
per graph keeps two threads from replaying it at once (different shapes replay side by side, each graph has its
own memory pool and stream). The network's precision is captured with it: fp32 inputs are cast to fp16 / bf16
inside the graph and floating outputs back to fp32, so callers always see the manifest's dtypes.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from rlopt.backends.base import flatten_outputs

WARMUP_CALLS = 3  # TorchScript's profiling executor specializes during the first calls: capture the specialized code


def torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def cast_inputs(torch: Any, tensors: list[Any], compute: Any) -> list[Any]:
    """Floating inputs in the compute dtype (fp16 / bf16 networks); others as they are."""
    if compute is None:
        return tensors
    return [t.to(compute) if t.is_floating_point() else t for t in tensors]


def fp32_outputs(torch: Any, result: Any, compute: Any) -> list[Any]:
    outputs = flatten_outputs(result)
    if compute is None:
        return outputs
    return [t.float() if t.is_floating_point() else t for t in outputs]


class ShapeGraph:
    """The module captured at one input signature; `replay` is thread-safe."""

    def __init__(self, torch: Any, module: Any, inputs: list[tuple[tuple[int, ...], np.dtype]], compute: Any,
                 device: str) -> None:
        self._torch, self._lock = torch, threading.Lock()
        self.static_inputs = [torch.zeros(shape, dtype=torch_dtype(torch, dtype), device=device)
                              for shape, dtype in inputs]
        self.pinned_inputs = [torch.empty(shape, dtype=torch_dtype(torch, dtype), pin_memory=True)
                              for shape, dtype in inputs]
        self.stream = torch.cuda.Stream()
        self.stream.wait_stream(torch.cuda.current_stream())
        with torch.no_grad(), torch.cuda.stream(self.stream):
            for _ in range(WARMUP_CALLS):
                module(*cast_inputs(torch, self.static_inputs, compute))
        torch.cuda.current_stream().wait_stream(self.stream)
        self.graph = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(self.graph, stream=self.stream):
            self.static_outputs = fp32_outputs(torch, module(*cast_inputs(torch, self.static_inputs, compute)),
                                               compute)
        self.pinned_outputs = [torch.empty(tuple(t.shape), dtype=t.dtype, pin_memory=True)
                               for t in self.static_outputs]

    def replay(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        torch = self._torch
        with self._lock:
            with torch.cuda.stream(self.stream):
                for array, pinned, static in zip(arrays, self.pinned_inputs, self.static_inputs):
                    pinned.numpy()[...] = array
                    static.copy_(pinned, non_blocking=True)
                self.graph.replay()
                for static, pinned in zip(self.static_outputs, self.pinned_outputs):
                    pinned.copy_(static, non_blocking=True)
            self.stream.synchronize()
            return [pinned.numpy().copy() for pinned in self.pinned_outputs]


__all__ = ["ShapeGraph", "WARMUP_CALLS", "cast_inputs", "fp32_outputs", "torch_dtype"]
