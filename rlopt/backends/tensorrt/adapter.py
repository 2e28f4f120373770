"""A thin adapter over the real `tensorrt` Python API, for TensorRT 10 and 11.

The two majors differ where it matters here (measured on the 11.4 bindings, shared notes; NVIDIA's
10.x -> 11.x migration guide):
- TensorRT 10: precision by builder flags (`BuilderFlag.FP16` / `BF16`) on a weakly typed network.
- TensorRT 11: every network is strongly typed; `BuilderFlag.FP16`/`BF16`/`INT8` are gone, so
  reduced precision must already be in the ONNX graph (rlopt.backends.tensorrt.prepare writes the casts).
Both: ONNX parser, one optimization profile per plan profile, workspace pool limit, REFIT,
builder optimization level, a timing cache loaded and saved back, a progress monitor
(`IProgressMonitor`) that also enforces the plan's time budget by cancelling the build. TF32 is on by
default in a builder config (Ampere and later run fp32 layers in TF32): rlopt clears it unless
`tensorrt.tf32: true`, so an fp32 engine is fp32 and is gated at the recipe's fp32 tolerances.

Nothing here imports `tensorrt`: the caller passes the module, after the GPU gate
(rlopt.backends.tensorrt.build). That also lets the tests drive it with a recording stand-in.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType
from typing import Any, Callable

from rlopt.backends.tensorrt import gate
from rlopt.errors import BackendUnavailable, StageError, located
from rlopt.backends.tensorrt.plan import TensorRTPlan

SUPPORTED_MAJORS = (10, 11)

ProgressCallback = Callable[[str], None]


def major_version(trt: ModuleType) -> int:
    try:
        return int(str(trt.__version__).split(".")[0])
    except (AttributeError, ValueError):
        return -1


def stderr_progress(line: str) -> None:
    """Default progress sink: one line per phase on stderr (stdout stays clean for --json)."""
    print(f"tensorrt: {line}", file=sys.stderr, flush=True)


@dataclass
class BuildResult:
    engine_bytes: int
    seconds: float
    facts: dict[str, Any] = field(default_factory=dict)


def make_progress_monitor(trt: ModuleType, deadline: float, report: ProgressCallback) -> Any:
    """An IProgressMonitor that reports phases and cancels the build once `deadline` (monotonic) passes."""

    class _BudgetMonitor(trt.IProgressMonitor):  # type: ignore[misc,name-defined]
        def __init__(self) -> None:
            trt.IProgressMonitor.__init__(self)
            self.cancelled = False
            self.phases: list[str] = []

        def phase_start(self, phase_name: str, parent_phase: str | None, num_steps: int) -> None:
            self.phases.append(phase_name)
            indent = "  " if parent_phase else ""
            report(f"{indent}{phase_name} ({num_steps} steps)")

        def step_complete(self, phase_name: str, step: int) -> bool:
            if time.monotonic() > deadline:
                self.cancelled = True
                return False
            return True

        def phase_finish(self, phase_name: str) -> None:
            pass

    return _BudgetMonitor()


class TensorRTAdapter:
    """Builds a serialized engine from an ONNX file and a TensorRTPlan with whichever supported major is installed."""

    def __init__(self, trt: ModuleType, progress: ProgressCallback | None = None) -> None:
        self.trt = trt
        self.major = major_version(trt)
        if self.major not in SUPPORTED_MAJORS:
            raise BackendUnavailable(f"TensorRT {getattr(trt, '__version__', '?')} is installed; this rlopt builds "
                                     f"with TensorRT {' or '.join(map(str, SUPPORTED_MAJORS))}")
        self.progress = progress or stderr_progress

    @property
    def strongly_typed_only(self) -> bool:
        return self.major >= 11

    def graph_casts_for(self, precision: str) -> str | None:
        """Precision that must be written into the ONNX graph before parsing (TensorRT 11's strong typing): fp16.
        bf16 on TensorRT 11 is built in fp32 with a notice (precision_notice), never a cast this rlopt cannot write."""
        if self.strongly_typed_only and precision == "fp16":
            return precision
        return None

    def built_precision(self, plan: TensorRTPlan) -> str:
        """What the engine computes in: the plan's precision where honoured, else fp32; tf32 where fp32 may use it."""
        precision = plan.precision if self.precision_notice(plan.precision) is None else "fp32"
        return "tf32" if precision == "fp32" and plan.tf32 else precision

    def precision_notice(self, precision: str) -> str | None:
        """One line when this TensorRT cannot honour `precision`; None when it can."""
        if precision == "int8":
            return ("int8 not applied: TensorRT needs explicit quantization (Q/DQ nodes) for int8, which this rlopt "
                    "does not write; built in fp32")
        if precision == "bf16" and self.strongly_typed_only:
            return ("bf16 not applied: TensorRT 11 needs bf16 casts in the graph and this rlopt writes only fp16 "
                    "casts; built in fp32")
        return None

    def _config(self, builder: Any, plan: TensorRTPlan, precision: str) -> Any:
        trt = self.trt
        config = builder.create_builder_config()
        config.set_memory_pool_limit(trt.MemoryPoolType.WORKSPACE, plan.workspace_bytes)
        config.builder_optimization_level = plan.builder_optimization_level
        if plan.refittable:
            config.set_flag(trt.BuilderFlag.REFIT)
        if plan.tf32:
            config.set_flag(trt.BuilderFlag.TF32)
        else:  # on by default: fp32 layers would run in TF32 and miss the fp32 gate
            config.clear_flag(trt.BuilderFlag.TF32)
        if not self.strongly_typed_only:
            if precision == "fp16":
                config.set_flag(trt.BuilderFlag.FP16)
            elif precision == "bf16":
                config.set_flag(trt.BuilderFlag.BF16)
        for index, profile in enumerate(plan.profiles):
            trt_profile = builder.create_optimization_profile()
            for name, shape in profile.shapes:
                trt_profile.set_shape(name, shape.min, shape.opt, shape.max)
            if config.add_optimization_profile(trt_profile) < 0:
                shapes = ", ".join(f"{name} {list(r.min)}..{list(r.max)}" for name, r in profile.shapes)
                raise StageError(f"TensorRT refused optimization profile {index} of {plan.network} ({shapes}; see "
                                 "the TensorRT log above)")
        return config

    def build(self, onnx_path: Path, plan: TensorRTPlan, out_path: Path) -> BuildResult:
        """Parse, configure, build and write `out_path` (model.plan); StageError on parse/build failure or timeout."""
        trt = self.trt
        started = time.monotonic()
        precision = self.built_precision(plan)
        logger = trt.Logger(trt.Logger.WARNING)
        builder = gate.started(trt.Builder, logger, what="builder")
        # No creation flags: TensorRT 10 stays weakly typed so FP16/BF16 builder flags take effect;
        # TensorRT 11 is always strongly typed (its STRONGLY_TYPED flag is accepted and ignored).
        network = builder.create_network(0)
        parser = gate.started(trt.OnnxParser, network, logger, what="ONNX parser")
        if not parser.parse_from_file(str(onnx_path)):
            errors = [str(parser.get_error(i)) for i in range(parser.num_errors)]
            detail = "; ".join(errors[:3]) or "no detail"
            raise StageError(f"TensorRT's ONNX parser rejected {onnx_path.name}: {detail}")
        config = self._config(builder, plan, "fp32" if precision == "tf32" else precision)
        cache = self._load_timing_cache(config, plan.timing_cache)
        monitor = make_progress_monitor(trt, started + plan.time_budget_s, self.progress)
        config.progress_monitor = monitor
        self.progress(f"building {plan.network} ({precision}, {len(plan.profiles)} profile(s), "
                      f"budget {plan.time_budget_s:.0f} s)")
        serialized = builder.build_serialized_network(network, config)
        seconds = time.monotonic() - started
        if serialized is None:
            if monitor.cancelled:
                raise StageError(f"TensorRT build of {plan.network} exceeded its time budget "
                                 f"({plan.time_budget_s:.0f} s, tensorrt.build_timeout_s) and was cancelled")
            raise StageError(f"TensorRT could not build {plan.network} (see the TensorRT log above)")
        data = memoryview(serialized)
        tmp = out_path.with_name(f".{out_path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(data)
        os.replace(tmp, out_path)
        if cache is not None and plan.timing_cache is not None:
            self._save_timing_cache(cache, plan.timing_cache)
        facts = {"tensorrt": str(trt.__version__), "major": self.major,
                 "typing": "strong (always, TensorRT 11)" if self.strongly_typed_only else "weak, builder flags",
                 "precision_built": precision, "phases": list(monitor.phases), "build_seconds": round(seconds, 2)}
        return BuildResult(len(data), seconds, facts)

    def _load_timing_cache(self, config: Any, path: Path | None) -> Any:
        data = path.read_bytes() if path is not None and path.is_file() else b""
        cache = config.create_timing_cache(data)
        if not config.set_timing_cache(cache, ignore_mismatch=False):
            raise StageError(located(path or "timing cache", "tensorrt.timing_cache", "TensorRT refused this timing "
                                     "cache (made by another TensorRT version or GPU)",
                                     "delete it, or give each GPU and TensorRT version a file of its own"))
        return cache

    @staticmethod
    def _save_timing_cache(cache: Any, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        tmp.write_bytes(memoryview(cache.serialize()))
        os.replace(tmp, path)
