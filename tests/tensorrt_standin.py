"""A stand-in for the slice of TensorRT 10 / 11's Python API that rlopt calls: it refuses what TensorRT refuses and
computes what the engine would compute, so the tests of the adapter, the runner and the refit hook can fail.

- Its public surface uses only names the real bindings define (tests/data/tensorrt_names_<major>.txt; checked by
  tests/backends/test_tensorrt_names.py). Bookkeeping for the tests starts with an underscore.
- Builder flags keep TensorRT's state and defaults: TF32 is on until cleared, so an engine built without clearing
  it computes its fp32 matrix products in TF32 (each operand rounded to a 10-bit mantissa, as ONNX Runtime does when
  casting through float16), and FP16 / BF16 (TensorRT 10) round the same way to their own mantissas.
- `add_optimization_profile` returns -1 for a profile whose ranges are not min <= opt <= max; the build refuses a
  network input no profile covers; `set_timing_cache` refuses a cache made "elsewhere".
- An engine is the parsed ONNX graph, its profiles, flags and weights: `execute_async_v3` reads its inputs at the
  addresses given (host memory: the runner tests pass a torch whose "device" is the CPU), runs the graph in ONNX
  Runtime and writes the outputs there. `set_input_shape` returns False for a shape outside the context's profile;
  an execution context used by two threads at once raises, like the undefined behaviour it is on a GPU.
- `Refitter` refuses an engine built without REFIT (pybind11's TypeError); `OnnxParserRefitter` sets every weight
  from a graph file; with `refit_drops_bias` a refit keeps the old 1-D weights, as the REFIT bias-drop bug did.
- With `cuda_fails`, Builder and Runtime raise pybind11's TypeError for a null object, as when CUDA cannot start.
"""

from __future__ import annotations

import ctypes
import enum
import importlib.machinery
import pickle
import threading
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"STANDIN-TRT-ENGINE"
NULLPTR = "pybind11::init(): factory function returned nullptr"
ROUNDING = {"TF32": 10, "FP16": 10, "BF16": 7}  # mantissa bits each flag rounds fp32 products to
NUMPY = {"FLOAT": np.float32, "HALF": np.float16, "INT8": np.int8, "INT32": np.int32, "INT64": np.int64,
         "BOOL": np.bool_, "UINT8": np.uint8}
ONNX_TO_TRT = {1: "FLOAT", 10: "HALF", 3: "INT8", 6: "INT32", 7: "INT64", 9: "BOOL", 2: "UINT8", 16: "BF16"}


def make_tensorrt(version: str = "11.4.0", *, steps: int = 3, clock: list[float] | None = None, parse_ok: bool = True,
                  cuda_fails: bool = False, refit_drops_bias: bool = False,
                  busy_s: float = 0.002) -> types.ModuleType:
    """A fresh module named `tensorrt` with its own call log at `module._calls` ((class, method, args) tuples)."""
    calls: list[tuple[str, str, tuple]] = []
    major = int(version.split(".")[0])
    trt = types.ModuleType("tensorrt")
    trt.__spec__ = importlib.machinery.ModuleSpec("tensorrt", None)
    trt.__version__ = version
    trt._calls = calls

    def record(owner: str, method: str, *args: Any) -> None:
        calls.append((owner, method, args))

    flags = ["REFIT", "TF32", "SPARSE_WEIGHTS"] + (["FP16", "BF16", "INT8"] if major == 10 else [])
    trt.BuilderFlag = enum.Enum("BuilderFlag", flags)
    trt.NetworkDefinitionCreationFlag = enum.IntEnum("NetworkDefinitionCreationFlag", {"STRONGLY_TYPED": 0})
    trt.MemoryPoolType = enum.Enum("MemoryPoolType", ["WORKSPACE"])
    trt.TensorIOMode = enum.Enum("TensorIOMode", ["NONE", "INPUT", "OUTPUT"])
    trt.DataType = enum.Enum("DataType", [*NUMPY, "BF16"])
    trt.float32, trt.float16, trt.bfloat16 = trt.DataType.FLOAT, trt.DataType.HALF, trt.DataType.BF16

    def nptype(trt_type: Any) -> type:
        if trt_type.name not in NUMPY:
            raise TypeError("Could not resolve TensorRT datatype to an equivalent numpy datatype.")
        return NUMPY[trt_type.name]

    trt.nptype = nptype

    class Logger:
        WARNING = "WARNING"

        def __init__(self, severity: str) -> None:
            record("Logger", "__init__", severity)

    class IProgressMonitor:
        def __init__(self) -> None:
            record("IProgressMonitor", "__init__")

    class ITimingCache:
        def __init__(self, data: bytes) -> None:
            self._data = bytes(data)

        def serialize(self) -> bytes:
            record("ITimingCache", "serialize")
            return b"cache:" + self._data.removeprefix(b"cache:")

    class IOptimizationProfile:
        def __init__(self) -> None:
            self._shapes: dict[str, tuple[tuple, tuple, tuple]] = {}

        def set_shape(self, input: str, min: tuple, opt: tuple, max: tuple) -> None:
            record("IOptimizationProfile", "set_shape", input, tuple(min), tuple(opt), tuple(max))
            self._shapes[input] = (tuple(min), tuple(opt), tuple(max))

    class IBuilderConfig:
        def __init__(self) -> None:
            self.progress_monitor = None
            self.builder_optimization_level = 3
            self._profiles: list[dict[str, tuple[tuple, tuple, tuple]]] = []
            self._flags = {"TF32"}  # TensorRT's default: fp32 layers may use TF32 on Ampere and later

        def set_memory_pool_limit(self, pool: Any, size: int) -> None:
            record("IBuilderConfig", "set_memory_pool_limit", pool.name, size)

        def set_flag(self, flag: Any) -> None:
            record("IBuilderConfig", "set_flag", flag.name)
            self._flags.add(flag.name)

        def clear_flag(self, flag: Any) -> None:
            record("IBuilderConfig", "clear_flag", flag.name)
            self._flags.discard(flag.name)

        def get_flag(self, flag: Any) -> bool:
            return flag.name in self._flags

        def add_optimization_profile(self, profile: IOptimizationProfile) -> int:
            record("IBuilderConfig", "add_optimization_profile")
            ordered = all(all(a <= b <= c for a, b, c in zip(lo, mid, hi)) and len(lo) == len(mid) == len(hi)
                          for lo, mid, hi in profile._shapes.values())
            if not profile._shapes or not ordered:
                return -1
            self._profiles.append(dict(profile._shapes))
            return len(self._profiles) - 1

        def create_timing_cache(self, serialized_timing_cache: bytes) -> ITimingCache:
            record("IBuilderConfig", "create_timing_cache", bytes(serialized_timing_cache))
            return ITimingCache(serialized_timing_cache)

        def set_timing_cache(self, cache: ITimingCache, ignore_mismatch: bool) -> bool:
            record("IBuilderConfig", "set_timing_cache", ignore_mismatch)
            return ignore_mismatch or not cache._data.startswith(b"elsewhere")

        def __setattr__(self, name: str, value: Any) -> None:
            if name in ("builder_optimization_level", "progress_monitor") and "_flags" in self.__dict__:
                record("IBuilderConfig", f"{name}=", value if name != "progress_monitor" else "monitor")
            object.__setattr__(self, name, value)

    class INetworkDefinition:
        def __init__(self) -> None:
            self._model: Any = None

    class Builder:
        def __init__(self, logger: Logger) -> None:
            if cuda_fails:
                raise TypeError(NULLPTR)
            record("Builder", "__init__")

        def create_network(self, flags: int = 0) -> INetworkDefinition:
            record("Builder", "create_network", flags)
            return INetworkDefinition()

        def create_builder_config(self) -> IBuilderConfig:
            record("Builder", "create_builder_config")
            return IBuilderConfig()

        def create_optimization_profile(self) -> IOptimizationProfile:
            record("Builder", "create_optimization_profile")
            return IOptimizationProfile()

        def build_serialized_network(self, network: INetworkDefinition, config: IBuilderConfig) -> bytes | None:
            record("Builder", "build_serialized_network")
            inputs = _graph_inputs(network._model)
            if not config._profiles or any(set(p) != set(inputs) for p in config._profiles):
                return None  # a dynamic input without a profile: TensorRT logs an error and builds nothing
            monitor = config.progress_monitor
            if monitor is not None:
                monitor.phase_start("Building engine", None, steps)
                for step in range(steps):
                    if clock is not None:
                        clock[0] += 1.0
                    if not monitor.step_complete("Building engine", step):
                        return None
                monitor.phase_finish("Building engine")
            rounding = next((flag for flag in ("BF16", "FP16", "TF32") if flag in config._flags), None)
            return MAGIC + pickle.dumps({"major": major, "model": network._model.SerializeToString(),
                                         "profiles": config._profiles, "rounding": rounding,
                                         "refittable": "REFIT" in config._flags})

    class OnnxParser:
        def __init__(self, network: INetworkDefinition, logger: Logger) -> None:
            record("OnnxParser", "__init__")
            self._network, self._errors = network, []

        @property
        def num_errors(self) -> int:
            return len(self._errors)

        def get_error(self, index: int) -> str:
            return self._errors[index]

        def parse_from_file(self, model: str) -> bool:
            import onnx

            record("OnnxParser", "parse_from_file", model.rsplit("/", 1)[-1])
            loaded = onnx.load(model)
            foreign = [n.op_type for n in loaded.graph.node if n.domain not in ("", "ai.onnx")]
            if not parse_ok or foreign:
                self._errors = [f"In node 3 ({(foreign or ['Foo'])[0]}): UNSUPPORTED_NODE"]
                return False
            self._network._model = loaded
            return True

    class IExecutionContext:
        def __init__(self, engine: ICudaEngine) -> None:
            self._engine, self._profile = engine, 0
            self._shapes: dict[str, tuple] = {}
            self._addresses: dict[str, int] = {}
            self._in_use = threading.Lock()

        def _enter(self) -> None:
            if not self._in_use.acquire(blocking=False):
                raise RuntimeError("one IExecutionContext used by two threads at once (TensorRT contexts are not "
                                   "thread-safe)")

        def set_optimization_profile_async(self, profile_index: int, stream_handle: int) -> bool:
            record("IExecutionContext", "set_optimization_profile_async", profile_index)
            if not 0 <= profile_index < len(self._engine._profiles):
                return False
            self._profile, self._shapes = profile_index, {}
            return True

        def set_input_shape(self, name: str, shape: tuple) -> bool:
            self._enter()
            try:
                record("IExecutionContext", "set_input_shape", name, tuple(shape), self._profile)
                lo, _, hi = self._engine._profiles[self._profile].get(name, ((), (), ()))
                if len(shape) != len(lo) or not all(a <= d <= b for a, d, b in zip(lo, shape, hi)):
                    return False
                self._shapes[name] = tuple(shape)
                return True
            finally:
                self._in_use.release()

        def get_tensor_shape(self, name: str) -> tuple:
            if name in self._shapes:
                return self._shapes[name]
            if set(self._shapes) != set(self._engine._inputs):
                return tuple(-1 for _ in self._engine._outputs.get(name, ()))
            return self._engine._output_shapes(self._shapes)[name]

        def set_tensor_address(self, name: str, memory: int) -> bool:
            self._addresses[name] = int(memory)
            return name in self._engine._inputs or name in self._engine._outputs

        def execute_async_v3(self, stream_handle: int) -> bool:
            self._enter()
            try:
                record("IExecutionContext", "execute_async_v3", stream_handle)
                engine = self._engine
                if set(self._shapes) != set(engine._inputs) or set(self._addresses) < {*engine._inputs,
                                                                                        *engine._outputs}:
                    return False
                feeds = {name: _read(self._addresses[name], self._shapes[name], engine._dtype(name))
                         for name in engine._inputs}
                time.sleep(busy_s)  # a kernel takes time: two threads in one context overlap here
                for name, value in zip(engine._outputs, engine._session().run(list(engine._outputs), feeds)):
                    ctypes.memmove(self._addresses[name], np.ascontiguousarray(value).ctypes.data, value.nbytes)
                return True
            finally:
                self._in_use.release()

    class ICudaEngine:
        def __init__(self, state: dict[str, Any]) -> None:
            import onnx

            self._state, self._profiles = state, state["profiles"]
            self._model = onnx.load_from_string(state["model"])
            self._inputs = _graph_inputs(self._model)
            self._outputs = {o.name: tuple(d.dim_value or -1 for d in o.type.tensor_type.shape.dim)
                             for o in self._model.graph.output}
            self._weights = {name: array for name, array in _initializers(self._model).items()}
            self._built: Any = None
            self._lock = threading.Lock()

        @property
        def num_io_tensors(self) -> int:
            return len(self._inputs) + len(self._outputs)

        @property
        def num_optimization_profiles(self) -> int:
            return len(self._profiles)

        def get_tensor_name(self, index: int) -> str:
            return [*self._inputs, *self._outputs][index]

        def get_tensor_mode(self, name: str) -> Any:
            return trt.TensorIOMode.INPUT if name in self._inputs else trt.TensorIOMode.OUTPUT

        def get_tensor_dtype(self, name: str) -> Any:
            values = {v.name: v for v in [*self._model.graph.input, *self._model.graph.output]}
            return trt.DataType[ONNX_TO_TRT[values[name].type.tensor_type.elem_type]]

        def _dtype(self, name: str) -> np.dtype:
            return np.dtype(nptype(self.get_tensor_dtype(name)))

        def get_tensor_profile_shape(self, name: str, profile_index: int) -> list[tuple]:
            return [tuple(dims) for dims in self._profiles[profile_index][name]]

        def create_execution_context(self) -> IExecutionContext:
            record("ICudaEngine", "create_execution_context")
            return IExecutionContext(self)

        def serialize(self) -> bytes:
            import onnx

            model = onnx.load_from_string(self._state["model"])
            _set_initializers(model, self._weights)
            return MAGIC + pickle.dumps({**self._state, "model": model.SerializeToString()})

        def _session(self) -> Any:
            with self._lock:
                if self._built is None:
                    self._built = _ort_session(self._model, self._weights, self._state["rounding"])
                return self._built

        def _output_shapes(self, shapes: dict[str, tuple]) -> dict[str, tuple]:
            feeds = {name: np.zeros(shapes[name], dtype=self._dtype(name)) for name in self._inputs}
            values = self._session().run(list(self._outputs), feeds)
            return {name: tuple(v.shape) for name, v in zip(self._outputs, values)}

    class Runtime:
        def __init__(self, logger: Logger) -> None:
            if cuda_fails:
                raise TypeError(NULLPTR)
            record("Runtime", "__init__")

        def deserialize_cuda_engine(self, serialized_engine: bytes) -> ICudaEngine | None:
            record("Runtime", "deserialize_cuda_engine", len(serialized_engine))
            if not bytes(serialized_engine).startswith(MAGIC):
                return None
            state = pickle.loads(bytes(serialized_engine)[len(MAGIC):])
            return ICudaEngine(state) if state["major"] == major else None

    class Weights:
        def __init__(self, a: np.ndarray) -> None:
            if not a.flags["C_CONTIGUOUS"]:
                raise TypeError("Weights need a contiguous array")
            self._array = a

    class Refitter:
        def __init__(self, engine: ICudaEngine, logger: Logger) -> None:
            if not engine._state["refittable"]:
                raise TypeError(NULLPTR)
            record("Refitter", "__init__")
            self._engine, self._given = engine, {}

        def get_all_weights(self) -> list[str]:
            return list(self._engine._weights)

        def set_named_weights(self, name: str, weights: Weights) -> bool:
            record("Refitter", "set_named_weights", name)
            old = self._engine._weights.get(name)
            if old is None or old.size != weights._array.size or old.dtype != weights._array.dtype:
                return False
            self._given[name] = weights._array.reshape(old.shape).copy()
            return True

        def get_missing_weights(self) -> list[str]:
            return [name for name in self._engine._weights if name not in self._given]

        def refit_cuda_engine(self) -> bool:
            record("Refitter", "refit_cuda_engine")
            if self.get_missing_weights():
                return False
            kept = {n: v for n, v in self._given.items() if not (refit_drops_bias and v.ndim == 1)}
            with self._engine._lock:
                self._engine._weights.update(kept)
                self._engine._built = None
            self._given = {}
            return True

    class OnnxParserRefitter:
        def __init__(self, refitter: Refitter, logger: Logger) -> None:
            record("OnnxParserRefitter", "__init__")
            self._refitter, self._errors = refitter, []

        @property
        def num_errors(self) -> int:
            return len(self._errors)

        def get_error(self, index: int) -> str:
            return self._errors[index]

        def refit_from_file(self, model: str) -> bool:
            import onnx

            record("OnnxParserRefitter", "refit_from_file", Path(model).name)
            found = _initializers(onnx.load(model))
            for name in self._refitter.get_all_weights():
                if name not in found or not self._refitter.set_named_weights(name, Weights(found[name])):
                    self._errors.append(f"weight {name} not found or of another shape")
            return not self._errors

    for cls in (Logger, IProgressMonitor, ITimingCache, IOptimizationProfile, IBuilderConfig, INetworkDefinition,
                Builder, OnnxParser, IExecutionContext, ICudaEngine, Runtime, Weights, Refitter, OnnxParserRefitter):
        setattr(trt, cls.__name__, cls)
    return trt


def _graph_inputs(model: Any) -> list[str]:
    initializers = {init.name for init in model.graph.initializer}
    return [value.name for value in model.graph.input if value.name not in initializers]


def _initializers(model: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    from rlopt.onnx_graph import subgraphs

    return {init.name: numpy_helper.to_array(init) for graph in subgraphs(model.graph) for init in graph.initializer}


def _set_initializers(model: Any, weights: dict[str, np.ndarray]) -> None:
    from onnx import numpy_helper

    from rlopt.onnx_graph import subgraphs

    for graph in subgraphs(model.graph):
        for init in graph.initializer:
            if init.name in weights:
                init.CopyFrom(numpy_helper.from_array(np.asarray(weights[init.name], dtype=numpy_helper.to_array(
                    init).dtype), init.name))


def _rounded(model: Any, rounding: str) -> Any:
    """Every MatMul / Gemm / Conv operand of an fp32 graph cast through float16 (TF32, FP16) or bfloat16 (BF16):
    the products of an engine that computes them with 10 (7) mantissa bits."""
    from onnx import TensorProto, helper

    from rlopt.onnx_graph import subgraphs

    if any(init.data_type != TensorProto.FLOAT for init in model.graph.initializer):
        return model  # precision already in the graph (TensorRT 11's fp16 casts): strongly typed
    narrow = TensorProto.BFLOAT16 if rounding == "BF16" else TensorProto.FLOAT16
    for index, graph in enumerate(subgraphs(model.graph)):
        nodes = []
        for node in graph.node:
            if node.op_type in ("MatMul", "Gemm", "Conv"):
                for slot in range(min(2, len(node.input))):
                    source = node.input[slot]
                    low, back = f"{source}__round{index}_{len(nodes)}", f"{source}__rounded{index}_{len(nodes)}"
                    nodes.append(helper.make_node("Cast", [source], [low], to=narrow))
                    nodes.append(helper.make_node("Cast", [low], [back], to=TensorProto.FLOAT))
                    node.input[slot] = back
            nodes.append(node)
        del graph.node[:]
        graph.node.extend(nodes)
    return model


def _ort_session(model: Any, weights: dict[str, np.ndarray], rounding: str | None) -> Any:
    import onnx
    import onnxruntime as ort

    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    _set_initializers(copy, weights)
    if rounding is not None:
        copy = _rounded(copy, rounding)
    options = ort.SessionOptions()
    options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL  # keep the casts
    return ort.InferenceSession(copy.SerializeToString(), options, providers=["CPUExecutionProvider"])


def _read(address: int, shape: tuple, dtype: np.dtype) -> np.ndarray:
    count = int(np.prod(shape)) * dtype.itemsize
    return np.frombuffer((ctypes.c_char * count).from_address(address), dtype=dtype).reshape(shape).copy()
