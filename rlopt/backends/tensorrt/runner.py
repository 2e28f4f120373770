"""Runner for `model.plan`: a TensorRT 10/11 engine run through the name-based I/O API (execute_async_v3).

Thread-safe: every call takes an execution slot of its own (rlopt.backends.tensorrt.slots: one execution context,
stream and set of buffers, allocated once) from the pool of the optimization profile its shapes fall in, the
narrowest profile that holds them. Device buffers, pinned host buffers and streams come from torch (a CUDA build
on the GPU machine), so no extra CUDA binding is needed. The gate comes before `tensorrt` is imported
(rlopt.backends.tensorrt.gate); `trt` and `torch` can be passed in, which the tests do with stand-ins.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from rlopt.backends.base import Runner
from rlopt.backends.tensorrt import gate
from rlopt.backends.tensorrt.facts import TensorRTFacts
from rlopt.backends.tensorrt.slots import Slot, SlotPool, TensorSpec
from rlopt.errors import ArtifactError, BackendUnavailable, located

Range = tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]


def narrowest_profile(profiles: list[dict[str, Range]], shapes: Mapping[str, tuple[int, ...]]) -> int | None:
    """The index of the profile holding every input shape whose ranges are narrowest (the sum of max - min over all
    dims; the lower index on a tie), or None when no profile holds them."""
    best: tuple[int, int] | None = None
    for index, profile in enumerate(profiles):
        fits = all(len(shapes[name]) == len(lo) and all(a <= d <= b for a, d, b in zip(lo, shapes[name], hi))
                   for name, (lo, _, hi) in profile.items())
        if fits:
            width = sum(b - a for lo, _, hi in profile.values() for a, b in zip(lo, hi))
            if best is None or width < best[0]:
                best = (width, index)
    return None if best is None else best[1]


class TensorRTRunner(Runner):
    """Owns the runtime, engine and execution slots it creates; `close` releases them."""

    def __init__(self, path: Path, input_names: list[str], facts: TensorRTFacts | Mapping[str, Any], *,
                 trt: ModuleType | None = None, torch: ModuleType | None = None) -> None:
        self.input_names = input_names
        if trt is None:
            reason = gate.unavailable_reason()
            if reason is not None:
                raise BackendUnavailable(f"a TensorRT engine cannot run here: {reason}")
            trt = gate.load_tensorrt()
        self._torch = torch or gate.cuda_torch()
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = gate.started(trt.Runtime, self._logger, what="runtime")
        self._engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if self._engine is None:
            raise ArtifactError(located(path, "", "TensorRT cannot deserialize this engine (built by another TensorRT "
                                        "version or for another GPU)", "recompile MODEL_DIR on this machine"))
        engine = self._engine
        names = [engine.get_tensor_name(i) for i in range(engine.num_io_tensors)]
        modes = {n: engine.get_tensor_mode(n) for n in names}
        inputs = [n for n in names if modes[n] == trt.TensorIOMode.INPUT]
        outputs = [n for n in names if modes[n] == trt.TensorIOMode.OUTPUT]
        if sorted(inputs) != sorted(input_names):
            raise ArtifactError(located(path, "", f"engine inputs {inputs} differ from the manifest's {input_names}",
                                        "recompile MODEL_DIR"))
        dtypes = {}
        for name in names:
            try:
                dtypes[name] = np.dtype(trt.nptype(engine.get_tensor_dtype(name)))
            except TypeError:
                raise ArtifactError(located(path, "", f"engine tensor '{name}' is {engine.get_tensor_dtype(name)}, "
                                            "which has no numpy type", "keep the network's inputs and outputs in "
                                            "numpy types (fp32 at the edges)")) from None
        self._inputs = [TensorSpec(n, dtypes[n]) for n in input_names]
        self._outputs = [TensorSpec(n, dtypes[n]) for n in outputs]
        self.profiles: list[dict[str, Range]] = [
            {n: tuple(tuple(int(d) for d in dims) for dims in engine.get_tensor_profile_shape(n, index))
             for n in input_names}  # type: ignore[misc]
            for index in range(engine.num_optimization_profiles)]
        self.pools = [SlotPool(lambda index=index: self._slot(index)) for index in range(len(self.profiles))]
        for pool in self.pools:  # one slot per profile now: its errors surface at open, its first call is warm
            pool.give_back(pool.take())

    def _slot(self, index: int) -> Slot:
        maxima = {name: hi for name, (_, _, hi) in self.profiles[index].items()}
        return Slot(self._torch, self._engine, index, maxima, self._inputs, self._outputs)

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        shapes = {spec.name: tuple(feeds[spec.name].shape) for spec in self._inputs}
        index = narrowest_profile(self.profiles, shapes)
        if index is None:
            raise ValueError(f"shapes {({n: list(s) for n, s in shapes.items()})} are outside every optimization "
                             f"profile of this engine ({len(self.profiles)} profile(s))")
        pool = self.pools[index]
        slot = pool.take()
        try:
            return slot.run(feeds)
        finally:
            pool.give_back(slot)

    def close(self) -> None:
        for pool in getattr(self, "pools", []):
            pool.close()
        self.pools = []
        self._engine = None
        self._runtime = None
