"""Verify one built backend through the same runners the runtime uses: the `verify <backend>` stage (its latencies
are the `latency` stage's, `latency.py`).

The parity gate itself is `rlopt.verify.gate_runner`, shared with `rlopt verify`; a network with recurrent
state is checked over every recorded step with the backend's own state fed back (`rlopt.parity.run_parity`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from rlopt.backends import BACKENDS, open_runner
from rlopt.errors import BackendUnavailable, describe_exception
from rlopt.facts import ArtifactFacts
from rlopt.manifest import BackendRecord, file_record, sha256_file
from rlopt.parity import Tolerance
from rlopt.reference import Reference
from rlopt.stages.base import Context, Stage, StageOutput, package_digest
from rlopt.timing import LatencyStats, measure
from rlopt.verify import gate_runner

VARIANT_SAMPLES = 4
Infer = Callable[[dict[str, np.ndarray]], list[np.ndarray]]


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
        latency = {**base.facts.variant_latency_us, variant: {"opt": round(at_opt["opt"].p50_us, 2)}}
        base.facts = base.facts.updated(variant_latency_us=latency)


class VerifyBackend(Stage):
    """Parity of one built backend; reused from the cache when artifact, reference and gate are unchanged."""

    name, inputs, cached, machine_dependent = "verify", ("reference.npz",), True, True
    # the gate and the timing (the runner's package is in `config`): a changed one re-runs, not a cached verdict
    helpers = ("rlopt.verify", "rlopt.parity", "rlopt.timing", "rlopt.reference", "rlopt.facts", "rlopt.runtime.routes",
               "rlopt.backends", "rlopt.backends.base", "rlopt.arrays", "rlopt.onnx_session")

    def __init__(self, backend: str, output: StageOutput, tol: Tolerance, identity: Any = None) -> None:
        self.backend, self.output, self.tol, self.identity = backend, output, tol, identity

    @property
    def label(self) -> str:
        return f"verify {self.backend}"

    def config(self, ctx: Context) -> Any:
        assert self.output.artifact is not None
        facts: ArtifactFacts = self.output.facts
        files = [self.output.artifact, *(ctx.staging / ref.path for ref in facts.companion_files())]
        identity = self.identity if self.identity is not None else [sha256_file(f) for f in files]
        return {"artifact": identity, "facts": facts.as_dict(), "reference": sha256_file(ctx.artifacts["reference.npz"]),
                "tolerance": self.tol.__dict__, "kind": ctx.spec.kind, "distribution": ctx.spec.distribution,
                "runner_code": package_digest(BACKENDS[self.backend].runner.split(":")[0])}

    def upstream(self, ctx: Context) -> dict[str, Any]:
        return {}

    def run(self, ctx: Context) -> StageOutput:
        record, failure = self.measure(ctx)
        return StageOutput(None, {"record": record.model_dump(mode="json"), "failure": failure})

    def detail(self, ctx: Context, out: StageOutput) -> str:
        record = BackendRecord.of(self.backend, out.facts["record"])
        if record.parity is None:
            return out.facts["failure"] or record.facts.not_verified or ""
        return ("ok" if record.parity.passed else "FAILED") + f" max_abs {record.parity.max_abs:.2e}"

    def measure(self, ctx: Context) -> tuple[BackendRecord, str | None]:
        backend, output, tol, spec, reference = self.backend, self.output, self.tol, ctx.spec, ctx.reference
        assert output.artifact is not None
        facts: ArtifactFacts = output.facts
        if spec.precision != "fp32" and facts.precision_built is None:  # a build that records none ran fp32
            facts = facts.updated(notice=f"precision {spec.precision} not applied: {backend} runs fp32 on this CPU")
        record = file_record(ctx.staging, output.artifact)
        base = BackendRecord(path=record.path, sha256=record.sha256, bytes=record.bytes, facts=facts)
        try:
            runner = open_runner(backend, output.artifact, list(spec.inputs), facts)
        except BackendUnavailable as exc:
            base.facts = base.facts.updated(verified=False, not_verified=str(exc))
            return base, None
        except Exception as exc:  # the library refused the artifact it just built: a failed verification, named
            base.facts = base.facts.updated(verify_error=f"opening it raised {describe_exception(exc)}")
            return base, f"{ctx.name}/{backend}: {record.path}: opening it raised {describe_exception(exc)}"
        try:
            gate = gate_runner(runner, reference, spec.kind, spec.distribution, tol, variant_samples=VARIANT_SAMPLES,
                               facts=base.facts)
            base.parity = gate.parity
            base.facts = base.facts.with_verdicts(gate.variant_parity)
            if gate.error is not None:
                base.facts = base.facts.updated(verify_error=gate.error)
            failure = gate.failure(f"{ctx.name}/{backend}")
            if failure is not None:
                return base, failure
            if gate.serving is not None and gate.serving_infer is not None:
                _time_variant(base, gate.serving, gate.serving_infer, reference)
        finally:
            runner.close()
        return base, None


def backend_record(ctx: Context, backend: str, out: StageOutput, artifact: Any) -> tuple[BackendRecord, str | None]:
    """The record a `verify <backend>` stage produced, with path / sha256 / bytes of the file here."""
    record = BackendRecord.of(backend, out.facts["record"])
    current = file_record(ctx.staging, artifact)
    record.path, record.sha256, record.bytes = current.path, current.sha256, current.bytes
    return record, out.facts["failure"]


__all__ = ["VARIANT_SAMPLES", "VerifyBackend", "backend_record", "time_points"]
