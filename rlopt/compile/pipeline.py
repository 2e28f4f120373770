"""`rlopt compile`: recipe -> model -> per network: reference, script, ONNX, backends -> verify -> latency -> manifest.

The pipeline composes stages and owns everything around them: timing, skips, hashes and the
atomic publish of MODEL_DIR (built in a hidden sibling, renamed into place last).
"""

from __future__ import annotations

import hashlib
import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

import numpy as np

from rlopt import __version__
from rlopt.errors import BackendUnavailable, StageError, UsageError, describe_exception, located
from rlopt.compile.cache import CacheHit, StageCache
from rlopt.lazy import version_of
from rlopt.locking import exclusive_lock
from rlopt.machine import cpu_identity, machine_facts
from rlopt.manifest import (
    MANIFEST_NAME,
    SCHEMA_VERSION,
    BackendRecord,
    FileRecord,
    InputProfile,
    Latency,
    Manifest,
    NetworkRecord,
    file_record,
    sha256_file,
    shape_label,
    write_json,
)
from rlopt.parity import Tolerance
from rlopt.recipe import BACKENDS, NetworkSpec, Recipe, load_recipe
from rlopt.reference import Reference, record_reference
from rlopt.runtime import auto_routes, ranked_backends, unbucketed_variant
from rlopt.backends import open_runner
from rlopt.backends.tvm.runner import bucket_files
from rlopt.stages.base import StageOutput
from rlopt.timing import LatencyStats, measure
from rlopt.verify import check_parity
from rlopt.compile.gpu_path import precision_record, tolerance_for, write_triton

CPU_BACKENDS = ("torchscript", "onnxruntime", "tvm")
CACHED_BUILDS = ("tvm", "tensorrt")
VARIANT_SAMPLES = 4


class Reporter(Protocol):
    def stage_started(self, network: str, stage: str) -> None: ...

    def stage_finished(self, network: str, stage: str, status: str, seconds: float, detail: str) -> None: ...


class _Silent:
    def stage_started(self, network: str, stage: str) -> None:
        pass

    def stage_finished(self, network: str, stage: str, status: str, seconds: float, detail: str) -> None:
        pass


@dataclass
class CompileResult:
    model_dir: Path
    manifest: Manifest
    failures: list[str] = field(default_factory=list)
    seconds: float = 0.0
    warnings: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return not self.failures


def tool_versions() -> dict[str, str | None]:
    return {
        "rlopt": __version__,
        "torch": version_of("torch"),
        "onnx": version_of("onnx"),
        "onnxruntime": version_of("onnxruntime") or version_of("onnxruntime-gpu"),
        "apache-tvm": version_of("apache-tvm"),
        "apache-tvm-ffi": version_of("apache-tvm-ffi"),
        "tensorrt": version_of("tensorrt"),
        "numpy": version_of("numpy"),
        "pydantic": version_of("pydantic"),
    }


def rlopt_source_digest() -> str:
    """sha256 of rlopt's own source: a code change (even without a version bump) invalidates the cache."""
    package = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted(package.rglob("*.py")):
        digest.update(path.relative_to(package).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


CACHE_VERSIONS = {**{name: version for name, version in tool_versions().items() if name != "pydantic"},
                  "rlopt_source": rlopt_source_digest()}


def tuning_digest(recipe_path: Path) -> str | None:
    """sha256 over the recipe's tuning database (`<recipe>.tuning/`), so a new record invalidates TVM builds."""
    folder = recipe_path.parent / f"{recipe_path.stem}.tuning"
    if not folder.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        digest.update(f"{path.relative_to(folder).as_posix()}:{sha256_file(path)}".encode())
    return digest.hexdigest()


def _is_model_dir_or_empty(path: Path) -> bool:
    return not path.exists() or (path.is_dir() and ((path / MANIFEST_NAME).exists() or not any(path.iterdir())))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def remove_stale_partials(out_dir: Path) -> None:
    """Partial builds left by a killed compile (their pid is gone) are removed."""
    for leftover in out_dir.parent.glob(f".{out_dir.name}.partial-*"):
        try:
            pid = int(leftover.name.rsplit("-", 2)[-2])
        except ValueError:
            continue
        if not _pid_alive(pid):
            shutil.rmtree(leftover, ignore_errors=True)


def publish(staging: Path, out_dir: Path) -> None:
    """Swap the finished build into place; the previous MODEL_DIR is removed only after."""
    old: Path | None = None
    if out_dir.exists():
        old = out_dir.parent / f".{out_dir.name}.old-{os.getpid()}-{secrets.token_hex(3)}"
        os.rename(out_dir, old)
    os.rename(staging, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


class _Network:
    """Compiles one network inside the staging directory."""

    def __init__(self, recipe: Recipe, recipe_path: Path, name: str, spec: NetworkSpec, staging: Path,
                 reporter: Reporter, cache: StageCache) -> None:
        self.recipe, self.recipe_path, self.name, self.spec = recipe, recipe_path, name, spec
        self.staging, self.reporter, self.cache = staging, reporter, cache
        self.dir = staging / name
        self.stages: list[dict[str, Any]] = []
        self.scope = f"{recipe.name}/{name}"
        self.fingerprint = ""
        self.cache_outcomes: dict[str, str] = {}

    def key(self, **components: Any) -> dict[str, Any]:
        """Cache key components: what a stage reads, plus the model's identity and every tool's version."""
        return {"model": self.fingerprint, "versions": CACHE_VERSIONS, **components}

    def cached(self, stage: str, components: dict[str, Any], produce: Callable[[], Any],
               save: Callable[[Any], tuple[dict[str, Path], dict[str, Any]]],
               restore: Callable[[CacheHit], Any]) -> Any:
        """`produce()` unless the cache holds an entry for exactly these components; the outcome is recorded."""
        hit = self.cache.lookup(stage, components)
        if hit is not None:
            result, outcome = restore(hit), "hit"
        else:
            outcome = "miss: " + self.cache.explain_miss(self.scope, stage, components) if self.cache.enabled \
                else "off (--no-cache)"
            result = produce()
            files, facts = save(result)
            self.cache.store(stage, components, files, facts)
        self.cache.remember(self.scope, stage, components)
        self.cache_outcomes[stage] = outcome
        return result

    def new_files(self, before: set[Path]) -> dict[str, Path]:
        return {p.name: p for p in sorted(self.dir.iterdir()) if p.is_file() and p not in before}

    def restore_files(self, hit: CacheHit) -> None:
        for name, path in hit.files.items():
            shutil.copyfile(path, self.dir / name)

    def timed(self, stage: str, call: Callable[[], Any], detail: Callable[[Any], str] = lambda _: "") -> Any:
        self.reporter.stage_started(self.name, stage)
        start = time.perf_counter()
        try:
            result = call()
        except BackendUnavailable as exc:
            self._finish(stage, "skipped", start, str(exc))
            raise
        except Exception:
            self._finish(stage, "error", start, "")
            raise
        self._finish(stage, "ok", start, detail(result))
        return result

    def _finish(self, stage: str, status: str, start: float, detail: str) -> None:
        seconds = time.perf_counter() - start
        cache = self.cache_outcomes.pop(stage, None)
        entry = {"stage": stage, "status": status, "seconds": round(seconds, 3), "detail": detail}
        if cache is not None:
            entry["cache"] = cache
            detail = f"{detail} [cache {cache}]".strip()
        self.stages.append(entry)
        self.reporter.stage_finished(self.name, stage, status, seconds, detail)

    def build_backend(self, backend: str, ts: StageOutput, onnx_out: StageOutput) -> StageOutput:
        from rlopt.backends.onnxruntime.build import check_onnxruntime
        from rlopt.backends.tensorrt.build import build_engine
        from rlopt.backends.tvm.build import build_tvm
        from rlopt.backends.tvm.cuda import build_tvm_cuda, is_cuda_target

        source = self.onnx_for(backend, onnx_out.artifact)
        if backend == "tvm" and is_cuda_target(self.recipe.tvm.target):
            return self.timed("tvm", lambda: build_tvm_cuda(source, self.recipe.tvm, self.dir,
                                                            precision=self.spec.precision,
                                                            recipe_path=self.recipe_path, network=self.name),
                              lambda out: out.artifact.name if out.artifact else "")
        builders: dict[str, Callable[[], StageOutput]] = {
            "torchscript": lambda: StageOutput(ts.artifact, {"source": "torch.jit.script"}),
            "onnxruntime": lambda: self.build_onnxruntime(source, check_onnxruntime),
            "tvm": lambda: build_tvm(source, self.recipe.tvm, self.dir, recipe_path=self.recipe_path,
                                     network=self.name, spec=self.spec),
            "tensorrt": lambda: build_engine(source, self.plan, self.dir, recipe_path=self.recipe_path,
                                             network=self.name),
        }
        build = builders[backend]
        if backend in CACHED_BUILDS and not (backend == "tvm" and self.recipe.tvm.tune_trials > 0):
            build = self.cached_build(backend, source, build)
        return self.timed(backend, build, lambda out: (out.artifact.name if out.artifact else "")
                          + (f" ({out.facts['tuning_summary']})" if out.facts.get("tuning_summary") else ""))

    def cached_build(self, backend: str, source: Path, build: Callable[[], StageOutput]) -> Callable[[], StageOutput]:
        """A native build keyed by its ONNX input, its recipe section, this CPU and the tuning database."""
        components = self.key(
            stage=backend, upstream=sha256_file(source), precision=self.spec.precision,
            network=self.spec.model_dump(mode="json", include={"inputs", "profiles", "shapes"}),
            recipe={"tvm": self.recipe.tvm.model_dump(mode="json"),
                    "tensorrt": self.recipe.tensorrt.model_dump(mode="json")}[backend],
            machine=cpu_identity(), tuning_database=tuning_digest(self.recipe_path))
        before = {p for p in self.dir.iterdir()}

        def produce() -> StageOutput:
            return build()

        def save(out: StageOutput) -> tuple[dict[str, Path], dict[str, Any]]:
            assert out.artifact is not None
            return self.new_files(before), {"artifact": out.artifact.name, "facts": out.facts}

        def restore(hit: CacheHit) -> StageOutput:
            self.restore_files(hit)
            return StageOutput(self.dir / hit.facts["artifact"], hit.facts["facts"])

        return lambda: self.cached(backend, components, produce, save, restore)

    def onnx_for(self, backend: str, exported: Path) -> Path:
        """model.padded.onnx for a backend whose pad_gemm multiple is on (when padding changed anything)."""
        from rlopt.compile.gpu_path import padding_multiples

        on = padding_multiples(self.recipe).get(backend, 0) > 0
        return self.padded if (on and getattr(self, "padded", None) is not None) else exported

    def build_onnxruntime(self, source: Path, check: Callable[..., StageOutput]) -> StageOutput:
        """fp32 ONNX Runtime, or int8 dynamic quantization when the network asks for int8 and it passes its gate."""
        if self.spec.precision != "int8":
            return check(source, self.recipe.onnxruntime)
        from rlopt.compile.gpu_path import tolerance_for
        from rlopt.backends.onnxruntime.quantize import quantize_int8

        quantized = quantize_int8(source, self.dir / "model.int8.onnx", self.reference, kind=self.spec.kind,
                                  distribution=self.spec.distribution,
                                  gate=tolerance_for({"precision_built": "int8"}, self.recipe.verify),
                                  recipe_path=self.recipe_path, network=self.name)
        assert quantized.artifact is not None
        return StageOutput(quantized.artifact, {**check(quantized.artifact, self.recipe.onnxruntime).facts,
                                                **quantized.facts})

    def prepare_gpu_path(self, exported: Path, reference: Reference, failures: list[str]) -> None:
        """TensorRT plan (validated against the ONNX inputs) and GEMM padding, shared by the GPU backends and Triton."""
        from rlopt.compile.gpu_path import wanted_multiple
        from rlopt.lazy import require
        from rlopt.stages.pad_gemm import pad_gemm
        from rlopt.backends.tensorrt.plan import make_plan

        self.reference, self.padded = reference, None
        graph = require("onnx").load(str(exported))
        self.plan = self.timed("tensorrt plan", lambda: make_plan(self.spec, self.recipe.tensorrt, graph,
                                                                  recipe_path=self.recipe_path, network=self.name),
                               lambda plan: f"{len(plan.profiles)} profile(s), {plan.precision}")
        self.facts: dict[str, Any] = {"tensorrt_plan": self.plan.facts()}
        multiple = wanted_multiple(self.recipe)
        if multiple == 0:
            self.facts["pad_gemm"] = {"applied": False, "pad_gemm": self.recipe.pad_gemm,
                                      "reason": "off" if self.recipe.pad_gemm == 0 else
                                      "auto pads only for TensorRT / TVM-CUDA, and neither can build here"}
            return
        feeds = [reference.feeds(p, i) for p in reference.points for i in range(reference.samples(p))]
        padded = self.timed("pad_gemm", lambda: pad_gemm(exported, multiple, self.dir / "model.padded.onnx", feeds,
                                                          recipe_path=self.recipe_path, network=self.name,
                                                          pad_outputs=self.recipe.pad_gemm_outputs),
                            lambda out: f"{len(out.facts['padded'])} edge(s) padded, {len(out.facts['skipped'])} "
                                        f"skipped" + (f", max diff {out.facts['exactness']['max_abs_diff']:.1e}"
                                                      if out.artifact else ""))
        self.facts["pad_gemm"] = padded.facts
        if padded.artifact is None:
            return
        diff = padded.facts["exactness"]["max_abs_diff"]
        if diff > self.recipe.verify.atol:
            padded.facts["dropped"] = f"max diff {diff:.3g} vs the unpadded model > atol {self.recipe.verify.atol}"
            padded.artifact.unlink()
            failures.append(f"{self.name}/pad_gemm: padded model differs from the unpadded one by {diff:.3g}")
            return
        self.padded = padded.artifact

    def run(self, model: Any) -> tuple[NetworkRecord, list[str]]:
        from rlopt.stages.export_onnx import export_onnx
        from rlopt.stages.load_model import submodule
        from rlopt.stages.script import script_network

        spec, verify = self.spec, self.recipe.verify
        self.dir.mkdir()
        module = submodule(model, spec.module, self.recipe_path, self.name)
        ts = self.timed("script", lambda: script_network(module, self.dir / "model.ts", recipe_path=self.recipe_path,
                                                         network=self.name, module_path=spec.module))
        self.fingerprint = ts.facts["fingerprint"]
        interface = spec.model_dump(mode="json", include={"inputs", "outputs", "kind", "distribution"})
        reference_path = self.dir / "reference.npz"

        def new_reference() -> Reference:
            produced = record_reference(module, spec, verify.samples, verify.seed, recipe_path=self.recipe_path,
                                        network=self.name)
            produced.save(reference_path)
            return produced

        def restore_reference(hit: CacheHit) -> Reference:
            self.restore_files(hit)
            return Reference.load(reference_path, list(spec.inputs), list(spec.outputs))

        reference: Reference = self.timed(
            "reference",
            lambda: self.cached("reference", self.key(stage="reference", network=interface, shapes=spec.shapes,
                                                      verify={"samples": verify.samples, "seed": verify.seed}),
                                new_reference, lambda _: ({"reference.npz": reference_path}, {}), restore_reference),
            lambda ref: f"{len(ref.points)} shapes x {verify.samples} samples")
        self.reference_record = file_record(self.staging, reference_path)
        onnx_path = self.dir / "model.onnx"

        def restore_onnx(hit: CacheHit) -> StageOutput:
            self.restore_files(hit)
            return StageOutput(onnx_path, hit.facts)

        onnx_out = self.timed(
            "onnx",
            lambda: self.cached("onnx", self.key(stage="onnx", network=interface, opset=self.recipe.onnx.opset),
                                lambda: export_onnx(self.dir / "model.ts", spec, self.recipe.onnx.opset, onnx_path,
                                                    recipe_path=self.recipe_path, network=self.name),
                                lambda out: ({"model.onnx": onnx_path}, out.facts), restore_onnx),
            lambda out: f"opset {out.facts['opset']}, {out.facts['if_nodes']} If")
        artifacts: dict[str, BackendRecord] = {}
        failures: list[str] = []
        built: dict[str, StageOutput] = {}
        self.prepare_gpu_path(onnx_out.artifact, reference, failures)
        for backend in self.recipe.backends:
            try:
                built[backend] = self.build_backend(backend, ts, onnx_out)
            except BackendUnavailable as exc:
                artifacts[backend] = BackendRecord(skipped=str(exc))
            except StageError as exc:
                artifacts[backend] = BackendRecord(skipped=f"build failed: {exc}")
                failures.append(f"{self.name}/{backend}: build failed: {exc}")
        for backend, output in built.items():
            artifacts[backend], failure = self.verify_and_time(backend, output, reference,
                                                               tolerance_for(output.facts, verify))
            if failure:
                failures.append(failure)
        record = NetworkRecord(
            kind=spec.kind, distribution=spec.distribution, module=spec.module,
            inputs={n: InputProfile(dtype=s.dtype, min=s.dims("min"), opt=s.dims("opt"), max=s.dims("max"))
                    for n, s in spec.inputs.items()},
            outputs=list(spec.outputs), precision=spec.precision,
            tolerance={"atol": verify.atol, "rtol": verify.rtol, "max_kl": verify.max_kl},
            reference=self.reference_record,
            files={"model.ts": file_record(self.staging, self.dir / "model.ts"),
                   "model.onnx": file_record(self.staging, self.dir / "model.onnx")},
            artifacts={b: artifacts[b] for b in self.recipe.backends},
            stages=self.stages,
        )
        if self.padded is not None:
            record.files["model.padded.onnx"] = file_record(self.staging, self.padded)
        record.facts = {**self.facts, "precision": precision_record(spec, record.artifacts)}
        triton = self.timed("triton", lambda: write_triton(self.staging, self.recipe.name, self.name, record.artifacts,
                                                           self.plan, reference, spec),
                            lambda files: f"{len(files) // 2} model(s)")
        record.files.update(triton)
        record.facts["triton"] = sorted({path.split("/")[1] for path in triton})
        ranked = ranked_backends(record)
        record.selected = ranked[0] if ranked else None
        if ranked:
            plan = auto_routes(record, ranked)
            record.facts["auto_routes"] = {shape_label(key): name for key, name in plan.routes.items()} | {
                "other": plan.fallback}
            record.facts["auto_onnxruntime_spinning"] = plan.onnxruntime_spinning
        if record.selected is None:
            failures.append(f"{self.name}: no backend was built and verified")
        return record, failures

    def verify_and_time(self, backend: str, output: StageOutput, reference: Reference,
                        tol: Tolerance) -> tuple[BackendRecord, str | None]:
        """Parity and latency, reused from the cache when the artifact, reference and tolerance are unchanged."""
        assert output.artifact is not None
        files = [output.artifact, *(self.staging / f["path"] for f in bucket_files(output.facts))]
        identity = self.fingerprint if backend == "torchscript" else [sha256_file(f) for f in files]
        components = self.key(stage=f"verify {backend}", artifact=identity, facts=output.facts,
                              reference=self.reference_record.sha256, tolerance=tol.__dict__,
                              kind=self.spec.kind, distribution=self.spec.distribution, machine=cpu_identity())

        def restore(hit: CacheHit) -> tuple[BackendRecord, str | None]:
            record = BackendRecord.model_validate(hit.facts["record"])
            current = file_record(self.staging, output.artifact)
            record.path, record.sha256, record.bytes = current.path, current.sha256, current.bytes
            return record, hit.facts["failure"]

        def summary(result: tuple[BackendRecord, str | None]) -> str:
            parity = result[0].parity
            if parity is None:
                return result[1] or result[0].facts.get("not_verified", "")
            latency = ", ".join(f"{p} p50 {v.p50:.0f}us" for p, v in result[0].latency_us.items())
            return ("ok" if parity.passed else "FAILED") + f" max_abs {parity.max_abs:.2e}" + \
                (f"; {latency}" if latency else "")

        return self.timed(f"verify {backend}", lambda: self.cached(
            f"verify {backend}", components, lambda: self.measure_backend(backend, output, reference, tol),
            lambda result: ({}, {"record": result[0].model_dump(mode="json"), "failure": result[1]}), restore),
            summary)

    def quiet_latencies(self, output: StageOutput, reference: Reference, facts: dict[str, Any]) -> dict[str, float]:
        """ONNX Runtime's p50 per point with its pool not spinning between calls: what `auto` gets when ORT shares
        the process with another backend (spinning, an ORT-routed call made the next TVM call 11.7 ms, not 0.2)."""
        assert output.artifact is not None
        runner = open_runner("onnxruntime", output.artifact, list(self.spec.inputs), {**facts, "allow_spinning": False})
        try:
            return {point: round(stats.p50_us, 2)
                    for point, stats in time_points(runner.infer, reference, reference.points, budget_s=0.1).items()}
        finally:
            runner.close()

    def measure_backend(self, backend: str, output: StageOutput, reference: Reference,
                        tol: Tolerance) -> tuple[BackendRecord, str | None]:
        assert output.artifact is not None
        facts = dict(output.facts)
        if self.spec.precision != "fp32" and backend in CPU_BACKENDS and "precision_built" not in facts:
            facts["notice"] = f"precision {self.spec.precision} not applied: {backend} runs fp32 on this CPU"
        record = file_record(self.staging, output.artifact)
        base = BackendRecord(path=record.path, sha256=record.sha256, bytes=record.bytes, facts=facts)
        try:
            runner = open_runner(backend, output.artifact, list(self.spec.inputs), facts)
        except BackendUnavailable as exc:
            base.facts.update({"verified": False, "not_verified": str(exc)})
            return base, None
        try:
            try:
                parity = check_parity(runner.infer, reference, self.spec.kind, self.spec.distribution, tol)
            except Exception as exc:  # the backend itself failed on recorded inputs: a verification failure
                base.facts["verify_error"] = describe_exception(exc)
                return base, f"{self.name}/{backend}: running the artifact raised {describe_exception(exc)}"
            base.parity = parity
            if not parity.passed:
                return base, f"{self.name}/{backend}: parity failed (max_abs {parity.max_abs:.3g})"
            # tricks (TVM's padding into a bigger build) are used only where they pass; failing one turns it off
            gated = runner.gated_variants()
            for variant, infer in gated.items():
                try:
                    extra = check_parity(infer, reference.head(VARIANT_SAMPLES), self.spec.kind,
                                         self.spec.distribution, tol)
                except Exception as exc:  # a trick that cannot run is a trick not used
                    base.facts.setdefault("variant_parity", {})[variant] = {"passed": False,
                                                                            "error": describe_exception(exc)}
                    continue
                base.facts.setdefault("variant_parity", {})[variant] = extra.model_dump(mode="json")
            serving = unbucketed_variant(base.facts)
            # code paths `infer` may skip on the reference shapes (TVM's dynamic library) pass the same gate, on the
            # first VARIANT_SAMPLES samples per shape (same code at every shape; `rlopt verify` runs all); on one
            # sample per shape when padding serves every shape instead (the untuned dynamic library takes ~100 ms
            # a call at atari's opt: 1.2 s of compile for a fallback that serves nothing then)
            variants = runner.parity_variants()
            for variant, infer in variants.items():
                samples = VARIANT_SAMPLES if serving in (None, variant) else 1
                extra = check_parity(infer, reference.head(samples), self.spec.kind, self.spec.distribution, tol)
                base.facts.setdefault("variant_parity", {})[variant] = extra.model_dump(mode="json")
                if not extra.passed:
                    base.parity = extra
                    return base, f"{self.name}/{backend} ({variant}): parity failed (max_abs {extra.max_abs:.3g})"
            # the path that serves shapes without their own build is timed at opt, for `auto` to rank it
            paths = {**variants, **gated}
            if serving in paths:
                _time_variant(base, serving, paths[serving], reference)
            base.latency_us = {
                point: Latency(shape=reference.shape(point), p50=round(stats.p50_us, 2), p99=round(stats.p99_us, 2),
                               iterations=stats.iterations)
                for point, stats in time_points(runner.infer, reference, reference.points, budget_s=0.3).items()}
            if backend == "onnxruntime":
                base.facts["latency_without_spinning_us"] = self.quiet_latencies(output, reference, facts)
        finally:
            runner.close()
        return base, None


def _time_variant(base: BackendRecord, variant: str, infer: Callable[[dict[str, np.ndarray]], object],
                  reference: Reference) -> None:
    """A variant's latency at opt, for `auto` to rank the path that serves shapes without their own build."""
    at_opt = time_points(infer, reference, [p for p in reference.points if p == "opt"], budget_s=0.05,
                         min_iters=5, max_iters=200, warmup=1)
    if at_opt:
        base.facts.setdefault("variant_latency_us", {})[variant] = {"opt": round(at_opt["opt"].p50_us, 2)}


def time_points(infer: Callable[[dict[str, np.ndarray]], object], reference: Reference, points: list[str],
                **options: Any) -> dict[str, LatencyStats]:
    """Latency of `infer` on each point's first recorded sample (`options` go to rlopt.timing.measure)."""
    return {point: measure(lambda feeds=reference.feeds(point, 0): infer(feeds), **options) for point in points}


def resolve_options(recipe: Recipe, backends: list[str] | None, tune_trials: int | None, recipe_path: Path) -> Recipe:
    if backends:
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise UsageError(f"--backend {unknown[0]}: unknown backend; fix: use one of {', '.join(BACKENDS)}")
        recipe = recipe.model_copy(update={"backends": list(dict.fromkeys(backends))})
    if tune_trials is not None:
        if tune_trials < 0:
            raise UsageError("--tune-trials must be >= 0")
        recipe = recipe.model_copy(update={"tvm": recipe.tvm.model_copy(update={"tune_trials": tune_trials})})
    return recipe


def default_output_dir(recipe: Recipe) -> Path:
    return Path("artifacts") / recipe.name


def compile_recipe(recipe_path: Path | str, out_dir: Path | str | None = None, *, backends: list[str] | None = None,
                   tune_trials: int | None = None, reporter: Reporter | None = None,
                   cache: StageCache | None = None) -> CompileResult:
    """Compile every network of a recipe into MODEL_DIR; returns the manifest and any verification failures.

    `cache` defaults to the stage cache under $RLOPT_CACHE; pass StageCache(enabled=False) to bypass it.
    """
    started = time.perf_counter()
    cache = cache if cache is not None else StageCache()
    recipe_path = Path(recipe_path)
    reporter = reporter or _Silent()
    recipe = resolve_options(load_recipe(recipe_path), backends, tune_trials, recipe_path)
    out_dir = Path(out_dir) if out_dir is not None else default_output_dir(recipe)
    if not _is_model_dir_or_empty(out_dir):
        raise UsageError(located(out_dir, "-o", "exists and is not an rlopt MODEL_DIR",
                                 "choose another output directory or remove it"))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out_dir.parent / f".{out_dir.name}.lock", out_dir):
        remove_stale_partials(out_dir)
        staging = out_dir.parent / f".{out_dir.name}.partial-{os.getpid()}-{secrets.token_hex(3)}"
        staging.mkdir()
        try:
            (staging / "recipe.yaml").write_text(recipe.resolved_yaml(), encoding="utf-8")
            from rlopt.stages.load_model import build_model

            model, _ = build_model(recipe.model, recipe_path)
            networks: dict[str, NetworkRecord] = {}
            failures: list[str] = []
            for name, spec in recipe.networks.items():
                record, network_failures = _Network(recipe, recipe_path, name, spec, staging, reporter,
                                                    cache).run(model)
                networks[name] = record
                failures.extend(network_failures)
            manifest = Manifest(
                schema_version=SCHEMA_VERSION, name=recipe.name, rlopt_version=__version__,
                created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), versions=tool_versions(),
                machine=machine_facts(), recipe_sha256=recipe.sha256(),
                recipe=file_record(staging, staging / "recipe.yaml"), networks=networks,
            ).seal()
            write_json(staging / MANIFEST_NAME, manifest.model_dump(mode="json"))
            publish(staging, out_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return CompileResult(out_dir, manifest, failures, time.perf_counter() - started, list(cache.warnings))


__all__ = ["compile_recipe", "CompileResult", "Reporter", "FileRecord"]
