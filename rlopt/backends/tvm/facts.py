"""What a TVM build records (artifact facts of backend `tvm`) and its runner and `auto` read back."""

from __future__ import annotations

from typing import Any

from pydantic import Field

from rlopt.facts import ArtifactFacts, Facts
from rlopt.files import FileRecord

ShapeKey = tuple[tuple[int, ...], ...]
TUNE_HINT = "rlopt tune RECIPE"  # in `tuning_summary`: a cached build serves recipes at other paths
OTHER_SHAPES = {"padded": "zero-padded into the smallest bigger tuned library", "dynamic": "the dynamic library"}


class ShapeBuild(Facts):
    """One tuned static library, built for one named shape: its input and output shapes and its file."""

    points: list[str] = Field(default_factory=list, description="the named points (min, opt, ...) at this shape")
    shapes: dict[str, list[int]] = Field(default_factory=dict, description="input name -> dims")
    output_shapes: list[list[int]] | None = Field(None, description="static output dims, in the runner's order")
    tuned_kernels: list[str] = Field(default_factory=list)
    untuned_kernels: list[str] = Field(default_factory=list, description="kernels with arithmetic and no tuning record")
    rule_kernels: dict[str, str] = Field(default_factory=dict, description="kernel -> the schedule rule that "
                                         "scheduled it (rlopt.backends.tvm.schedules), for kernels with no record")
    default_kernels: list[str] = Field(default_factory=list, description="untuned kernels no rule scheduled: TVM's "
                                       "default loops")
    parallel_kernels: list[str] = Field(default_factory=list, description="rule-scheduled kernels whose tiles are "
                                        "split among TVM's threads")
    ifs_folded: int = 0
    param_names: list[str] = Field(default_factory=list, description="the weights its main takes, in order")
    file: FileRecord | None = Field(None, description="the library, next to the dynamic one")

    def key(self, input_names: list[str]) -> ShapeKey:
        """The input shapes in input order: how the runner and `auto` key a shape."""
        return tuple(tuple(int(d) for d in self.shapes[name]) for name in input_names)


class TvmParams(Facts):
    """The weights the libraries take as parameters: what refit rewrites instead of rebuilding."""

    file: FileRecord = Field(description="the params file (.npz keyed by initializer name), next to the libraries")
    onnx: str = Field(description="the ONNX file the libraries were built from (model.onnx or model.padded.onnx)")
    padded: bool = Field(False, description="built from the pad_gemm copy: refit reads the padded graph")
    names: list[str] = Field(default_factory=list, description="initializer names in the file, in order")


class TvmFacts(ArtifactFacts):
    """A TVM artifact: the dynamic library (the artifact itself) plus `shape_builds`, one static library each."""

    target: dict[str, Any] = Field(default_factory=dict, description="the TVM target, completed for the build host")
    cpu_features: list[str] = Field(default_factory=list, description="ISA features the generated code needs")
    num_threads: int | None = Field(None, description="TVM threads, chosen by measurement at compile time")
    calling_thread_only: bool = Field(
        False, description="computes on the calling thread alone, whatever TVM_NUM_THREADS says (an `auto` route, "
                           "RoutePlan.options; refit's side-by-side gates): a pool's fork-join stalls when another "
                           "process holds a core")
    shape_builds: list[ShapeBuild] = Field(default_factory=list)
    params: TvmParams | None = Field(None, description="None: the weights are baked in (cannot be refitted)")
    param_names: list[str] = Field(default_factory=list, description="the dynamic library's weights, in order")
    tuned: bool | None = None
    tuning_summary: str | None = None
    fused_kernels: list[str] = Field(default_factory=list)
    rule_kernels: dict[str, str] = Field(default_factory=dict, description="the dynamic library's kernels scheduled "
                                         "by a rule: kernel -> rule")
    thread_latency_us: dict[str, Any] = Field(default_factory=dict, description="p50 per thread count, per shape")
    database: dict[str, Any] | None = Field(None, description="the tuning database applied")
    pipeline: str | None = None
    shape_comparisons_tensorized: int | None = Field(None, description="shape comparisons rewritten for the VM")
    tvm: str | None = Field(None, description="the TVM version that built the libraries")
    library_holds: str | None = Field(None, description="a CUDA library: what it holds (kernels compile at load)")
    cross_compile_check: dict[str, Any] | None = Field(None, description="a CUDA library: nvcc's check of its kernels")

    @property
    def device_kind(self) -> str:
        return "cuda" if self.target.get("kind") == "cuda" else "cpu"

    @property
    def on_cpu(self) -> bool:
        return self.device_kind == "cpu"

    def summary(self) -> list[str]:
        """Fused kernels, tuning and threads, and what serves the shapes without a library of their own (and why
        padding does not, where it does not)."""
        lines = [f"fused kernels {', '.join(self.fused_kernels)}"] if self.fused_kernels else []
        lines += super().summary()
        if self.tuning_summary:
            lines.append(f"{self.tuning_summary}, {self.num_threads} thread(s), target {self.target}")
        serving = self.serving_variant()
        if serving is not None:
            lines.append(f"shapes without their own library: {OTHER_SHAPES[serving]}" + self._padding_note(serving))
        return lines

    def _padding_note(self, serving: str) -> str:
        """Why the artifact does not pad, when it does not."""
        gate = self.variant_parity.get("padded")
        if serving == "padded" or gate is None:
            return ""
        if not gate.passed:
            detail = gate.error or f"max_abs {getattr(gate, 'max_abs', None)}"
            return f" (padding failed the parity gate: {detail})"
        return " (padding does not reach every shape: a varying dim that no output follows)"

    def serving_variant(self) -> str | None:
        """'padded' once the parity gate passed it and every shape in [min, max] pads into some build, else
        'dynamic'; None without per-shape builds."""
        from rlopt.backends.tvm.padding import padding_plan

        if not self.shape_builds:
            return None
        plan = padding_plan(self.shape_builds, list(self.shape_builds[0].shapes))
        return "padded" if self.gate_passed("padded") and plan is not None and plan.covers_range else "dynamic"

    def route_detail(self, label: str) -> str:
        """'1 thread' where a route runs it on the calling thread alone, else its thread count."""
        return "1 thread" if self.calling_thread_only else f"{self.num_threads or 1} thread(s)"

    def bucket_files(self) -> list[FileRecord]:
        """The per-shape libraries that travel with the dynamic one."""
        return [build.file for build in self.shape_builds if build.file is not None]

    def companion_files(self) -> list[FileRecord]:
        """Everything loaded with the dynamic library: per-shape libraries and the params file."""
        return self.bucket_files() + ([self.params.file] if self.params is not None else [])

    def files_serving(self, point: str) -> list[FileRecord] | None:
        """A point with its own tuned library runs that library on the params file; the dynamic one is not called."""
        build = next((b for b in self.shape_builds if point in b.points and b.file is not None), None)
        if build is None or build.file is None:
            return None
        return [build.file] + ([self.params.file] if self.params is not None else [])


__all__ = ["ShapeBuild", "ShapeKey", "TvmFacts", "TvmParams"]
