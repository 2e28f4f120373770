"""Execution slots of a TensorRT engine: what one in-flight call owns.

An `IExecutionContext` is not thread-safe, so each call takes a slot of its own from the pool of the profile
its shapes fall in, and puts it back when done. A slot is one execution context bound to one optimization
profile, with its own CUDA stream, device buffers sized for the profile's max shapes and pinned host buffers of
the same size, all allocated once when the slot is made; a call copies its inputs into the pinned buffers,
copies them to the device on the slot's stream, runs `execute_async_v3` on that stream, copies the outputs back
on it and synchronizes the stream once. Several contexts may share one profile (Triton's TensorRT backend runs
its instances so), so concurrent calls of one shape run side by side, each on its own stream.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass
from typing import Any, Callable

import numpy as np

from rlopt.backends.tensorrt import gate
from rlopt.errors import ArtifactError


@dataclass(frozen=True)
class TensorSpec:
    name: str
    dtype: np.dtype


class Slot:
    """One execution context on one profile with its stream and buffers; one call at a time (the pool sees to it)."""

    def __init__(self, torch: Any, engine: Any, profile: int, max_shapes: dict[str, tuple[int, ...]],
                 inputs: list[TensorSpec], outputs: list[TensorSpec]) -> None:
        self._torch, self._inputs, self._outputs = torch, inputs, outputs
        self.profile = profile
        self.stream = torch.cuda.Stream()
        self.context = gate.started(engine.create_execution_context, what="execution context")
        if not self.context.set_optimization_profile_async(profile, self.stream.cuda_stream):
            raise ArtifactError(f"TensorRT refused to select optimization profile {profile} of this engine")
        for spec in inputs:
            self._set_shape(spec.name, max_shapes[spec.name])
        sizes = {spec.name: math.prod(max_shapes[spec.name]) for spec in inputs}
        for spec in outputs:
            shape = tuple(self.context.get_tensor_shape(spec.name))
            if any(dim < 0 for dim in shape):
                raise ArtifactError(f"output '{spec.name}' has a data-dependent shape {list(shape)}, which this "
                                    "runner does not serve")
            sizes[spec.name] = math.prod(shape)
        self.device: dict[str, Any] = {}
        self.host: dict[str, Any] = {}
        for spec in [*inputs, *outputs]:
            dtype = _torch_dtype(torch, spec.dtype)
            self.device[spec.name] = torch.empty(sizes[spec.name], dtype=dtype, device="cuda")
            self.host[spec.name] = torch.empty(sizes[spec.name], dtype=dtype, pin_memory=True)
            if not self.context.set_tensor_address(spec.name, self.device[spec.name].data_ptr()):
                raise ArtifactError(f"TensorRT refused the device buffer of '{spec.name}'")
        self.stream.synchronize()

    def _set_shape(self, name: str, shape: tuple[int, ...]) -> None:
        if not self.context.set_input_shape(name, tuple(shape)):
            raise ValueError(f"TensorRT refused input '{name}' of shape {list(shape)} in optimization profile "
                             f"{self.profile} (see the TensorRT log)")

    def run(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self._torch
        with torch.cuda.stream(self.stream):
            for spec in self._inputs:
                array = np.ascontiguousarray(feeds[spec.name], dtype=spec.dtype)
                count = array.size
                self.host[spec.name][:count].numpy()[...] = array.reshape(-1)
                self.device[spec.name][:count].copy_(self.host[spec.name][:count], non_blocking=True)
                self._set_shape(spec.name, array.shape)
            shapes = [tuple(self.context.get_tensor_shape(spec.name)) for spec in self._outputs]
            if not self.context.execute_async_v3(self.stream.cuda_stream):
                raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")
            for spec, shape in zip(self._outputs, shapes):
                count = math.prod(shape)
                self.host[spec.name][:count].copy_(self.device[spec.name][:count], non_blocking=True)
        self.stream.synchronize()
        return [self.host[spec.name][:math.prod(shape)].numpy().reshape(shape).copy()
                for spec, shape in zip(self._outputs, shapes)]

    def close(self) -> None:
        self.context = None
        self.device.clear()
        self.host.clear()


class SlotPool:
    """Idle slots of one profile: a call takes one (a new one when every slot is busy) and gives it back."""

    def __init__(self, make: Callable[[], Slot]) -> None:
        self._make, self._idle, self._lock = make, [], threading.Lock()
        self.made = 0

    def take(self) -> Slot:
        with self._lock:
            if self._idle:
                return self._idle.pop()
            self.made += 1
        try:
            return self._make()
        except BaseException:
            with self._lock:
                self.made -= 1
            raise

    def give_back(self, slot: Slot) -> None:
        with self._lock:
            self._idle.append(slot)

    def close(self) -> None:
        with self._lock:
            idle, self._idle = self._idle, []
        for slot in idle:
            slot.close()


def _torch_dtype(torch: Any, dtype: np.dtype) -> Any:
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


__all__ = ["Slot", "SlotPool", "TensorSpec"]
