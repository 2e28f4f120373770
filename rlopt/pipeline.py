"""`rlopt compile`: recipe -> model -> per network: reference, script, ONNX, backends -> verify -> latency -> manifest.

The pipeline composes stages and owns everything around them: timing, skips, hashes and the
atomic publish of MODEL_DIR (built in a hidden sibling, renamed into place last).
"""

from __future__ import annotations

import os
import secrets
import shutil
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Protocol

from rlopt import __version__
from rlopt.errors import BackendUnavailable, StageError, UsageError, located
from rlopt.lazy import version_of
from rlopt.locking import exclusive_lock
from rlopt.machine import machine_facts
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
    write_json,
)
from rlopt.parity import Tolerance
from rlopt.recipe import BACKENDS, NetworkSpec, Recipe, load_recipe
from rlopt.reference import Reference, record_reference
from rlopt.runtime import ranked_backends
from rlopt.runtime.backends import open_runner
from rlopt.stages.base import StageOutput
from rlopt.timing import measure
from rlopt.verify import check_parity

CPU_BACKENDS = ("torchscript", "onnxruntime", "tvm")


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
                 reporter: Reporter) -> None:
        self.recipe, self.recipe_path, self.name, self.spec = recipe, recipe_path, name, spec
        self.staging, self.reporter = staging, reporter
        self.dir = staging / name
        self.stages: list[dict[str, Any]] = []

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
        self.stages.append({"stage": stage, "status": status, "seconds": round(seconds, 3), "detail": detail})
        self.reporter.stage_finished(self.name, stage, status, seconds, detail)

    def build_backend(self, backend: str, ts: StageOutput, onnx_out: StageOutput) -> StageOutput:
        from rlopt.stages.onnxruntime_session import check_onnxruntime
        from rlopt.stages.tensorrt import build_engine
        from rlopt.stages.tvm_build import build_tvm

        builders: dict[str, Callable[[], StageOutput]] = {
            "torchscript": lambda: StageOutput(ts.artifact, {"source": "torch.jit.script"}),
            "onnxruntime": lambda: check_onnxruntime(onnx_out.artifact, self.recipe.onnxruntime),
            "tvm": lambda: build_tvm(onnx_out.artifact, self.recipe.tvm, self.dir, recipe_path=self.recipe_path,
                                     network=self.name),
            "tensorrt": lambda: build_engine(onnx_out.artifact, self.recipe.tensorrt, self.spec, self.dir),
        }
        return self.timed(backend, builders[backend], lambda out: out.artifact.name if out.artifact else "")

    def run(self, model: Any) -> tuple[NetworkRecord, list[str]]:
        from rlopt.stages.export_onnx import export_onnx
        from rlopt.stages.load_model import submodule
        from rlopt.stages.script import script_network

        spec, verify = self.spec, self.recipe.verify
        self.dir.mkdir()
        module = submodule(model, spec.module, self.recipe_path, self.name)
        reference: Reference = self.timed(
            "reference",
            lambda: record_reference(module, spec, verify.samples, verify.seed, recipe_path=self.recipe_path,
                                     network=self.name),
            lambda ref: f"{len(ref.points)} shapes x {verify.samples} samples")
        reference.save(self.dir / "reference.npz")
        ts = self.timed("script", lambda: script_network(module, self.dir / "model.ts", recipe_path=self.recipe_path,
                                                         network=self.name, module_path=spec.module))
        onnx_out = self.timed("onnx", lambda: export_onnx(self.dir / "model.ts", spec, self.recipe.onnx.opset,
                                                          self.dir / "model.onnx", recipe_path=self.recipe_path,
                                                          network=self.name),
                              lambda out: f"opset {out.facts['opset']}, {out.facts['if_nodes']} If")
        artifacts: dict[str, BackendRecord] = {}
        failures: list[str] = []
        built: dict[str, StageOutput] = {}
        for backend in self.recipe.backends:
            try:
                built[backend] = self.build_backend(backend, ts, onnx_out)
            except BackendUnavailable as exc:
                artifacts[backend] = BackendRecord(skipped=str(exc))
            except StageError as exc:
                artifacts[backend] = BackendRecord(skipped=f"build failed: {exc}")
                failures.append(f"{self.name}/{backend}: build failed: {exc}")
        tol = Tolerance(verify.atol, verify.rtol, verify.max_kl)
        for backend, output in built.items():
            artifacts[backend], failure = self.verify_and_time(backend, output, reference, tol)
            if failure:
                failures.append(failure)
        record = NetworkRecord(
            kind=spec.kind, distribution=spec.distribution, module=spec.module,
            inputs={n: InputProfile(dtype=s.dtype, min=s.dims("min"), opt=s.dims("opt"), max=s.dims("max"))
                    for n, s in spec.inputs.items()},
            outputs=list(spec.outputs), precision=spec.precision,
            tolerance={"atol": verify.atol, "rtol": verify.rtol, "max_kl": verify.max_kl},
            reference=file_record(self.staging, self.dir / "reference.npz"),
            files={"model.ts": file_record(self.staging, self.dir / "model.ts"),
                   "model.onnx": file_record(self.staging, self.dir / "model.onnx")},
            artifacts={b: artifacts[b] for b in self.recipe.backends},
            stages=self.stages,
        )
        ranked = ranked_backends(record)
        record.selected = ranked[0] if ranked else None
        if record.selected is None:
            failures.append(f"{self.name}: no backend was built and verified")
        return record, failures

    def verify_and_time(self, backend: str, output: StageOutput, reference: Reference,
                        tol: Tolerance) -> tuple[BackendRecord, str | None]:
        assert output.artifact is not None
        facts = dict(output.facts)
        if self.spec.precision != "fp32" and backend in CPU_BACKENDS:
            facts["notice"] = f"precision {self.spec.precision} not applied: {backend} runs fp32 on this CPU"
        record = file_record(self.staging, output.artifact)
        base = BackendRecord(path=record.path, sha256=record.sha256, bytes=record.bytes, facts=facts)
        try:
            runner = open_runner(backend, output.artifact, list(self.spec.inputs), facts)
        except BackendUnavailable as exc:
            base.skipped = str(exc)
            return base, None
        try:
            try:
                parity = self.timed(f"verify {backend}",
                                    lambda: check_parity(runner.infer, reference, self.spec.kind,
                                                         self.spec.distribution, tol),
                                    lambda p: ("ok" if p.passed else "FAILED") + f" max_abs {p.max_abs:.2e}")
            except Exception as exc:  # the backend itself failed on recorded inputs: a verification failure
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
                base.facts["verify_error"] = f"{type(exc).__name__}: {first}"
                return base, f"{self.name}/{backend}: running the artifact raised {type(exc).__name__}: {first}"
            base.parity = parity
            if not parity.passed:
                return base, f"{self.name}/{backend}: parity failed (max_abs {parity.max_abs:.3g})"
            latencies = {}
            for point in reference.points:
                feeds = reference.feeds(point, 0)
                stats = measure(lambda: runner.infer(feeds), budget_s=0.3)
                latencies[point] = Latency(shape=reference.shape(point), p50=round(stats.p50_us, 2),
                                           p99=round(stats.p99_us, 2), iterations=stats.iterations)
            base.latency_us = latencies
            self.stages.append({"stage": f"latency {backend}", "status": "ok", "seconds": 0.0,
                                "detail": ", ".join(f"{p} p50 {v.p50:.0f}us" for p, v in latencies.items())})
        finally:
            runner.close()
        return base, None


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
                   tune_trials: int | None = None, reporter: Reporter | None = None) -> CompileResult:
    """Compile every network of a recipe into MODEL_DIR; returns the manifest and any verification failures."""
    started = time.perf_counter()
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
                record, network_failures = _Network(recipe, recipe_path, name, spec, staging, reporter).run(model)
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
    return CompileResult(out_dir, manifest, failures, time.perf_counter() - started)


__all__ = ["compile_recipe", "CompileResult", "Reporter", "FileRecord"]
