"""A recording stand-in for the slice of the `tensorrt` Python API that rlopt calls. It builds nothing.

It mirrors the API surface of TensorRT 10 and 11 where they differ (11 has no BuilderFlag.FP16 /
BF16 / INT8; both have STRONGLY_TYPED, IProgressMonitor, timing caches and the name-based I/O
runtime) and records every call as (object, method, args), so tests can check the adapter's call
sequence per major version. `build_serialized_network` drives the attached progress monitor like
a real build would, and returns None when the monitor cancels.
"""

from __future__ import annotations

import enum
import types
from typing import Any

import numpy as np


def make_tensorrt(version: str, *, steps: int = 3, parse_ok: bool = True, engine_io: list[tuple] | None = None,
                  clock: list[float] | None = None) -> types.ModuleType:
    """A fresh module object named `tensorrt` with its own call log at `module.calls`."""
    calls: list[tuple[str, str, tuple]] = []
    major = int(version.split(".")[0])
    trt = types.ModuleType("tensorrt")
    trt.__version__ = version
    trt.calls = calls

    def record(owner: str, method: str, *args: Any) -> None:
        calls.append((owner, method, args))

    flag_names = ["REFIT", "TF32", "SPARSE_WEIGHTS"] + (["FP16", "BF16", "INT8"] if major == 10 else [])
    trt.BuilderFlag = enum.Enum("BuilderFlag", flag_names)
    trt.NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", {"STRONGLY_TYPED": 0})
    trt.MemoryPoolType = enum.Enum("MemoryPoolType", ["WORKSPACE"])
    trt.TensorIOMode = enum.Enum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"])
    trt.DataType = enum.Enum("DataType", ["FLOAT", "HALF"])

    class Logger:
        WARNING = "WARNING"

        def __init__(self, severity: str) -> None:
            record("Logger", "__init__", severity)

    class IProgressMonitor:
        def __init__(self) -> None:
            record("IProgressMonitor", "__init__")

    class TimingCache:
        def __init__(self, data: bytes) -> None:
            self.data = data

        def serialize(self) -> bytes:
            record("ITimingCache", "serialize")
            return b"cache:" + bytes(self.data)

    class Profile:
        def set_shape(self, name: str, lo: tuple, opt: tuple, hi: tuple) -> None:
            record("IOptimizationProfile", "set_shape", name, tuple(lo), tuple(opt), tuple(hi))

    class BuilderConfig:
        def __init__(self) -> None:
            self._progress_monitor = None

        def set_memory_pool_limit(self, pool: Any, size: int) -> None:
            record("IBuilderConfig", "set_memory_pool_limit", pool.name, size)

        def set_flag(self, flag: Any) -> None:
            record("IBuilderConfig", "set_flag", flag.name)

        def add_optimization_profile(self, profile: Profile) -> int:
            record("IBuilderConfig", "add_optimization_profile")
            return 0

        def create_timing_cache(self, data: bytes) -> TimingCache:
            record("IBuilderConfig", "create_timing_cache", bytes(data))
            return TimingCache(data)

        def set_timing_cache(self, cache: TimingCache, ignore_mismatch: bool) -> bool:
            record("IBuilderConfig", "set_timing_cache", ignore_mismatch)
            return True

        def __setattr__(self, name: str, value: Any) -> None:
            if name in ("builder_optimization_level", "progress_monitor"):
                record("IBuilderConfig", f"{name}=", value if name != "progress_monitor" else "monitor")
            object.__setattr__(self, name, value)

    class Network:
        pass

    class Builder:
        def __init__(self, logger: Logger) -> None:
            record("Builder", "__init__")

        def create_network(self, flags: int = 0) -> Network:
            record("Builder", "create_network", flags)
            return Network()

        def create_builder_config(self) -> BuilderConfig:
            record("Builder", "create_builder_config")
            return BuilderConfig()

        def create_optimization_profile(self) -> Profile:
            record("Builder", "create_optimization_profile")
            return Profile()

        def build_serialized_network(self, network: Network, config: BuilderConfig) -> bytes | None:
            record("Builder", "build_serialized_network")
            monitor = getattr(config, "progress_monitor", None)
            if monitor is not None:
                monitor.phase_start("Building engine", None, steps)
                for step in range(steps):
                    if clock is not None:
                        clock[0] += 1.0
                    if not monitor.step_complete("Building engine", step):
                        return None
                monitor.phase_finish("Building engine")
            return b"ENGINE-BYTES"

    class OnnxParser:
        num_errors = 0 if parse_ok else 1

        def __init__(self, network: Network, logger: Logger) -> None:
            record("OnnxParser", "__init__")

        def parse_from_file(self, path: str) -> bool:
            record("OnnxParser", "parse_from_file", path.rsplit("/", 1)[-1])
            return parse_ok

        def get_error(self, index: int) -> str:
            return "In node 3 (Foo): UNSUPPORTED_NODE"

    io = engine_io or [("obs", "INPUT", np.float32), ("logits", "OUTPUT", np.float32)]

    class Context:
        def __init__(self) -> None:
            self.shapes: dict[str, tuple] = {}

        def set_input_shape(self, name: str, shape: tuple) -> bool:
            record("IExecutionContext", "set_input_shape", name, tuple(shape))
            self.shapes[name] = tuple(shape)
            return True

        def get_tensor_shape(self, name: str) -> tuple:
            record("IExecutionContext", "get_tensor_shape", name)
            first = next(iter(self.shapes.values()))
            return (*first[:-1], 6)

        def set_tensor_address(self, name: str, address: int) -> bool:
            record("IExecutionContext", "set_tensor_address", name)
            return True

        def execute_async_v3(self, stream: int) -> bool:
            record("IExecutionContext", "execute_async_v3", stream)
            return True

    class Engine:
        num_io_tensors = len(io)

        def get_tensor_name(self, index: int) -> str:
            return io[index][0]

        def get_tensor_mode(self, name: str) -> Any:
            return trt.TensorIOMode[next(mode for n, mode, _ in io if n == name)]

        def get_tensor_dtype(self, name: str) -> Any:
            return next(dtype for n, _, dtype in io if n == name)

        def create_execution_context(self) -> Context:
            record("ICudaEngine", "create_execution_context")
            return Context()

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            record("Runtime", "__init__")

        def deserialize_cuda_engine(self, data: bytes) -> Engine | None:
            record("Runtime", "deserialize_cuda_engine", len(data))
            return Engine() if data.startswith(b"ENGINE") else None

    trt.Logger, trt.IProgressMonitor, trt.Builder, trt.OnnxParser = Logger, IProgressMonitor, Builder, OnnxParser
    trt.Runtime = Runtime
    trt.nptype = lambda dtype: dtype
    return trt


def make_cpu_torch() -> types.ModuleType:
    """Enough of torch.cuda for the runner's call sequence, with host memory standing in for device memory."""
    import torch

    fake = types.ModuleType("torch")
    fake.float32 = torch.float32

    class _Tensor:
        def __init__(self, array: np.ndarray) -> None:
            self.array = array

        def to(self, device: str) -> _Tensor:
            return self

        def data_ptr(self) -> int:
            return self.array.ctypes.data

        def cpu(self) -> _Tensor:
            return self

        def numpy(self) -> np.ndarray:
            return self.array

    class _Stream:
        cuda_stream = 1234

        def synchronize(self) -> None:
            pass

    class _StreamScope:
        def __init__(self, stream: _Stream) -> None:
            pass

        def __enter__(self) -> None:
            return None

        def __exit__(self, *exc: object) -> None:
            return None

    fake.cuda = types.SimpleNamespace(is_available=lambda: True, Stream=_Stream, stream=_StreamScope)
    fake.from_numpy = lambda array: _Tensor(array) if array.size else torch.from_numpy(array)
    fake.empty = lambda shape, dtype, device: _Tensor(np.zeros(shape, dtype=np.float32))
    return fake
