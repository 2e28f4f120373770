"""Runner for `model.plan`: a TensorRT 10/11 engine run through the name-based I/O API (execute_async_v3).

Device buffers and the CUDA stream come from torch (a CUDA build on the GPU machine), so no
extra CUDA binding is needed. The GPU gate comes before `tensorrt` is imported: deserializing
without a GPU segfaults the lean runtime (shared notes). `trt` and `torch` can be passed in,
which the call-sequence tests do with recording stand-ins.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from types import ModuleType
from typing import Any

import numpy as np

from rlopt.backends.base import Runner
from rlopt.backends.tensorrt.facts import TensorRTFacts
from rlopt.errors import ArtifactError, BackendUnavailable, located
from rlopt.lazy import require
from rlopt.machine import gpu_absent_reason


class TensorRTRunner(Runner):
    """Owns the runtime, engine, execution context and stream it creates; `close` releases them."""

    def __init__(self, path: Path, input_names: list[str], facts: TensorRTFacts | Mapping[str, Any], *,
                 trt: ModuleType | None = None, torch: ModuleType | None = None) -> None:
        self.input_names = input_names
        if trt is None:
            reason = gpu_absent_reason()
            if reason is not None:
                raise BackendUnavailable(f"a TensorRT engine needs an NVIDIA GPU: {reason}")
            trt = require("tensorrt")
        torch = torch or require("torch")
        if not torch.cuda.is_available():
            raise BackendUnavailable("the TensorRT runner takes device buffers from torch, and this torch has no CUDA "
                                     "(install a CUDA build of torch on the GPU machine)")
        self._trt, self._torch = trt, torch
        self._logger = trt.Logger(trt.Logger.WARNING)
        self._runtime = trt.Runtime(self._logger)
        self._engine = self._runtime.deserialize_cuda_engine(path.read_bytes())
        if self._engine is None:
            raise ArtifactError(located(path, "", "TensorRT cannot deserialize this engine (built by another TensorRT "
                                        "version or for another GPU)", "recompile MODEL_DIR on this machine"))
        self._context = self._engine.create_execution_context()
        names = [self._engine.get_tensor_name(i) for i in range(self._engine.num_io_tensors)]
        self._inputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.INPUT]
        self._outputs = [n for n in names if self._engine.get_tensor_mode(n) == trt.TensorIOMode.OUTPUT]
        if sorted(self._inputs) != sorted(input_names):
            raise ArtifactError(located(path, "", f"engine inputs {self._inputs} differ from the manifest's "
                                        f"{input_names}", "recompile MODEL_DIR"))
        self._dtypes = {n: np.dtype(trt.nptype(self._engine.get_tensor_dtype(n))) for n in names}
        self._stream = torch.cuda.Stream()

    def _torch_dtype(self, dtype: np.dtype) -> Any:
        return self._torch.from_numpy(np.empty(0, dtype=dtype)).dtype

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch, context = self._torch, self._context
        held = []
        with torch.cuda.stream(self._stream):
            for name in self._inputs:
                host = np.ascontiguousarray(feeds[name].astype(self._dtypes[name], copy=False))
                device = torch.from_numpy(host).to("cuda")
                held.append(device)
                context.set_input_shape(name, tuple(host.shape))
                context.set_tensor_address(name, device.data_ptr())
            outputs = []
            for name in self._outputs:
                shape = tuple(context.get_tensor_shape(name))
                out = torch.empty(shape, dtype=self._torch_dtype(self._dtypes[name]), device="cuda")
                context.set_tensor_address(name, out.data_ptr())
                outputs.append(out)
            if not context.execute_async_v3(self._stream.cuda_stream):
                raise RuntimeError("TensorRT execute_async_v3 failed (see the TensorRT log)")
        self._stream.synchronize()
        return [out.cpu().numpy() for out in outputs]

    def close(self) -> None:
        self._context = None
        self._engine = None
        self._runtime = None
