"""Verify and time one built backend through the same runners the runtime uses: the `verify <backend>` stage.

How a backend's outputs are compared with the reference is a `Verification`: one call per recorded
sample today (`SingleStep`); `MultiStep` runs several steps per sample with the compiled state fed
back (recurrent networks, contract section 8) against a reference step function.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np

from rlopt.backends import open_runner
from rlopt.backends.tvm.runner import bucket_files
from rlopt.compile.stage import Context, Stage, StageOutput
from rlopt.errors import BackendUnavailable, describe_exception
from rlopt.manifest import BackendRecord, Latency, file_record, sha256_file
from rlopt.parity import ParityAccumulator, Tolerance
from rlopt.reference import Reference
from rlopt.runtime import unbucketed_variant
from rlopt.timing import LatencyStats, measure
from rlopt.verify import check_parity

CPU_BACKENDS = ("torchscript", "onnxruntime", "tvm")
VARIANT_SAMPLES = 4
Infer = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


class Verification(Protocol):
    """Compares `infer` with the reference of a network; returns the parity result object (never a boolean)."""

    def check(self, infer: Infer, reference: Reference, kind: str, distribution: str, tol: Tolerance) -> Any: ...


class SingleStep:
    """One call per recorded sample, compared with PyTorch's recorded outputs."""

    def check(self, infer: Infer, reference: Reference, kind: str, distribution: str, tol: Tolerance) -> Any:
        return check_parity(infer, reference, kind, distribution, tol)


@dataclass
class MultiStep:
    """`steps` calls per recorded sample; after each, every state input takes the compiled state output it is
    fed from (`state`: input -> output), and `reference_step` (PyTorch) runs on the same feeds for comparison."""

    steps: int
    state: dict[str, str]
    reference_step: Infer

    def check(self, infer: Infer, reference: Reference, kind: str, distribution: str, tol: Tolerance) -> Any:
        accumulator = ParityAccumulator(kind, distribution, reference.output_names, tol)
        accumulator.shapes = [f"{point} {reference.shape(point)} x {self.steps} steps" for point in reference.points]
        for _point, feeds, _expected in reference.pairs():
            for _ in range(self.steps):
                compiled = infer(feeds)
                accumulator.add(self.reference_step(feeds), compiled)
                produced = dict(zip(reference.output_names, compiled))
                feeds = {**feeds, **{name: np.asarray(produced[out]) for name, out in self.state.items()}}
        return accumulator.result()


def verification_for(ctx: Context) -> Verification:
    """The verification a network gets: single-step unless a stage put another in ctx.artifacts['verification']."""
    chosen = ctx.artifacts.get("verification")
    return chosen if chosen is not None else SingleStep()


def time_points(infer: Callable[[dict[str, np.ndarray]], object], reference: Reference, points: list[str],
                **options: Any) -> dict[str, LatencyStats]:
    """Latency of `infer` on each point's first recorded sample (`options` go to rlopt.timing.measure)."""
    return {point: measure(lambda feeds=reference.feeds(point, 0): infer(feeds), **options) for point in points}


def _time_variant(base: BackendRecord, variant: str, infer: Callable[[dict[str, np.ndarray]], object],
                  reference: Reference) -> None:
    """A variant's latency at opt, for `auto` to rank the path that serves shapes without their own build."""
    at_opt = time_points(infer, reference, [p for p in reference.points if p == "opt"], budget_s=0.05,
                         min_iters=5, max_iters=200, warmup=1)
    if at_opt:
        base.facts.setdefault("variant_latency_us", {})[variant] = {"opt": round(at_opt["opt"].p50_us, 2)}


class VerifyBackend(Stage):
    """Parity and latency of one built backend; reused from the cache when artifact, reference and gate are unchanged."""

    name, inputs, cached, machine_dependent = "verify", ("reference.npz",), True, True

    def __init__(self, backend: str, output: StageOutput, tol: Tolerance) -> None:
        self.backend, self.output, self.tol = backend, output, tol

    @property
    def label(self) -> str:
        return f"verify {self.backend}"

    def config(self, ctx: Context) -> Any:
        assert self.output.artifact is not None
        files = [self.output.artifact, *(ctx.staging / f["path"] for f in bucket_files(self.output.facts))]
        identity = ctx.keys["module"] if self.backend == "torchscript" else [sha256_file(f) for f in files]
        return {"artifact": identity, "facts": self.output.facts, "reference": sha256_file(ctx.artifacts["reference.npz"]),
                "tolerance": self.tol.__dict__, "kind": ctx.spec.kind, "distribution": ctx.spec.distribution}

    def upstream(self, ctx: Context) -> dict[str, Any]:
        return {}

    def run(self, ctx: Context) -> StageOutput:
        record, failure = self.measure(ctx)
        return StageOutput(None, {"record": record.model_dump(mode="json"), "failure": failure})

    def detail(self, ctx: Context, out: StageOutput) -> str:
        record = BackendRecord.model_validate(out.facts["record"])
        if record.parity is None:
            return out.facts["failure"] or record.facts.get("not_verified", "")
        latency = ", ".join(f"{p} p50 {v.p50:.0f}us" for p, v in record.latency_us.items())
        return ("ok" if record.parity.passed else "FAILED") + f" max_abs {record.parity.max_abs:.2e}" + \
            (f"; {latency}" if latency else "")

    def quiet_latencies(self, ctx: Context, facts: dict[str, Any]) -> dict[str, float]:
        """ONNX Runtime's p50 per point with its pool not spinning between calls: what `auto` gets when ORT shares
        the process with another backend (spinning, an ORT-routed call made the next TVM call 11.7 ms, not 0.2)."""
        assert self.output.artifact is not None
        runner = open_runner("onnxruntime", self.output.artifact, list(ctx.spec.inputs),
                             {**facts, "allow_spinning": False})
        try:
            return {point: round(stats.p50_us, 2) for point, stats in
                    time_points(runner.infer, ctx.reference, ctx.reference.points, budget_s=0.1).items()}
        finally:
            runner.close()

    def measure(self, ctx: Context) -> tuple[BackendRecord, str | None]:
        backend, output, tol, spec, reference = self.backend, self.output, self.tol, ctx.spec, ctx.reference
        assert output.artifact is not None
        verification = verification_for(ctx)
        facts = dict(output.facts)
        if spec.precision != "fp32" and backend in CPU_BACKENDS and "precision_built" not in facts:
            facts["notice"] = f"precision {spec.precision} not applied: {backend} runs fp32 on this CPU"
        record = file_record(ctx.staging, output.artifact)
        base = BackendRecord(path=record.path, sha256=record.sha256, bytes=record.bytes, facts=facts)
        try:
            runner = open_runner(backend, output.artifact, list(spec.inputs), facts)
        except BackendUnavailable as exc:
            base.facts.update({"verified": False, "not_verified": str(exc)})
            return base, None
        try:
            try:
                parity = verification.check(runner.infer, reference, spec.kind, spec.distribution, tol)
            except Exception as exc:  # the backend itself failed on recorded inputs: a verification failure
                base.facts["verify_error"] = describe_exception(exc)
                return base, f"{ctx.name}/{backend}: running the artifact raised {describe_exception(exc)}"
            base.parity = parity
            if not parity.passed:
                return base, f"{ctx.name}/{backend}: parity failed (max_abs {parity.max_abs:.3g})"
            # tricks (TVM's padding into a bigger build) are used only where they pass; failing one turns it off
            gated = runner.gated_variants()
            for variant, infer in gated.items():
                try:
                    extra = verification.check(infer, reference.head(VARIANT_SAMPLES), spec.kind, spec.distribution,
                                               tol)
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
                extra = verification.check(infer, reference.head(samples), spec.kind, spec.distribution, tol)
                base.facts.setdefault("variant_parity", {})[variant] = extra.model_dump(mode="json")
                if not extra.passed:
                    base.parity = extra
                    return base, f"{ctx.name}/{backend} ({variant}): parity failed (max_abs {extra.max_abs:.3g})"
            # the path that serves shapes without their own build is timed at opt, for `auto` to rank it
            paths = {**variants, **gated}
            if serving in paths:
                _time_variant(base, serving, paths[serving], reference)
            base.latency_us = {
                point: Latency(shape=reference.shape(point), p50=round(stats.p50_us, 2), p99=round(stats.p99_us, 2),
                               iterations=stats.iterations)
                for point, stats in time_points(runner.infer, reference, reference.points, budget_s=0.3).items()}
            if backend == "onnxruntime":
                base.facts["latency_without_spinning_us"] = self.quiet_latencies(ctx, facts)
        finally:
            runner.close()
        return base, None


def backend_record(ctx: Context, out: StageOutput, artifact: Any) -> tuple[BackendRecord, str | None]:
    """The record a `verify <backend>` stage produced, with path / sha256 / bytes of the file here."""
    record = BackendRecord.model_validate(out.facts["record"])
    current = file_record(ctx.staging, artifact)
    record.path, record.sha256, record.bytes = current.path, current.sha256, current.bytes
    return record, out.facts["failure"]


__all__ = [
    "MultiStep",
    "SingleStep",
    "Verification",
    "VerifyBackend",
    "backend_record",
    "time_points",
    "verification_for",
]
