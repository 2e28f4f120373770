"""Typed facts: what compile records about an artifact or a network, and what the runtime reads back.

In manifest.json `facts` stays a plain JSON object (the manifest's records hold it as a dict, and compile writes
dicts); these models are its typed view. Each backend's model lives beside its runner (`rlopt/backends/<name>/
facts.py`, named by its `Backend.facts`); the network-level facts and the base every backend model extends live
here. Every model keeps keys it does not declare (extra="allow"), so a fact written today is never dropped or
refused; the declared ones are type-checked when manifest.json is read (`rlopt.manifest.read_manifest`).

Imports nothing but pydantic: the runtime reads these without torch, tvm or any compile code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field


class Facts(BaseModel):
    """A typed view of a `facts` object: declared keys are checked, every other key is kept as it was written."""

    model_config = ConfigDict(extra="allow")

    @classmethod
    def of(cls, facts: Facts | Mapping[str, Any] | None) -> Self:
        """`facts` as this model: a model of this class is returned as is, a dict (or another Facts) is validated."""
        if isinstance(facts, cls):
            return facts
        if isinstance(facts, Facts):
            return cls.model_validate(facts.as_dict())
        return cls.model_validate(dict(facts or {}))

    def as_dict(self) -> dict[str, Any]:
        """The JSON object these facts came from: only keys that were given (defaults are not added)."""
        return self.model_dump(mode="json", exclude_unset=True)


class FileRef(Facts):
    """A file listed inside facts (TVM's per-shape libraries): relative to MODEL_DIR, checked like any artifact."""

    path: str
    sha256: str
    bytes: int


class ParityGate(Facts):
    """The tolerances a reduced-precision artifact was gated with; `rlopt verify` re-checks with the same ones."""

    atol: float
    rtol: float
    max_kl: float
    why: str = ""


class VariantParity(Facts):
    """The parity gate's verdict on one code path of an artifact (a Parity record, or `error` when it raised)."""

    passed: bool = False
    error: str | None = None


class GpuIdentity(Facts):
    """The GPU an artifact was built and verified on (rlopt.machine.gpu_identity); `rlopt inspect` shows it."""

    name: str | None = None
    compute_capability: str | None = None
    driver: str | None = None
    cuda_runtime: str | None = Field(None, description="the CUDA runtime of torch's build")
    tensorrt: str | None = None


class ArtifactFacts(Facts):
    """Facts every backend's artifact may carry; a backend's own model extends this."""

    verified: bool | None = Field(None, description="False: built, but this machine could not run it (see not_verified)")
    not_verified: str | None = Field(None, description="why the artifact could not be verified at compile time")
    verify_error: str | None = Field(None, description="what running the artifact on recorded inputs raised")
    notice: str | None = Field(None, description="one line for the user (e.g. a precision not applied)")
    precision_built: str | None = Field(None, description="the precision the artifact was built in (fp32 when absent)")
    parity_gate: ParityGate | None = Field(None, description="reduced-precision tolerances this artifact was gated by")
    gpu: GpuIdentity | None = Field(None, description="the GPU a GPU artifact was built and verified on")
    variant_parity: dict[str, VariantParity] = Field(
        default_factory=dict, description="per code path (TVM's dynamic, padded): the parity gate's verdict")
    variant_latency_us: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="per code path: p50 latency per named point (opt), for `auto`")

    def companion_files(self) -> list[FileRef]:
        """Files that travel with the artifact and are loaded with it (checked like it); none by default."""
        return []

    def files_serving(self, point: str) -> list[FileRef] | None:
        """The companion files that alone compute named point `point`, or None: the artifact itself (and every
        companion) serves it. How refit's latency check tells which bytes a timing at a shape ran."""
        return None

    def gate_passed(self, variant: str) -> bool:
        """Whether compile's parity gate passed `variant` (variant_parity.<variant>.passed)."""
        verdict = self.variant_parity.get(variant)
        return verdict is not None and verdict.passed


class TensorRTPlanFacts(Facts):
    """The validated TensorRT plan: optimization profiles and builder settings (network facts.tensorrt_plan)."""

    profiles: list[dict[str, dict[str, list[int]]]] = Field(default_factory=list)
    precision: str | None = None
    precision_source: str | None = None
    workspace_mb: int | None = None
    refittable: bool | None = None
    builder_optimization_level: int | None = None
    timing_cache: str | None = None
    time_budget_s: float | None = None
    tf32: bool | None = Field(None, description="whether fp32 layers may run in TF32 (tensorrt.tf32)")


class PadGemmFacts(Facts):
    """GEMM padding of the exported graph (network facts.pad_gemm); `padded`, `skipped`, `exactness` kept as written."""

    applied: bool = False
    pad_gemm: int | str | None = None
    reason: str | None = None
    dropped: str | None = None


class PrecisionFacts(Facts):
    """What each backend did with the network's requested precision (network facts.precision)."""

    requested: str | None = None
    backends: dict[str, str] = Field(default_factory=dict)


class AutoChoiceFacts(Facts):
    """Why `auto` runs the route it runs: median latency per shape label ('other': shapes without a point of their
    own) of each candidate backend, measured in interleaved rounds in the two configurations a session can run."""

    mixed: bool = False
    reason: str = ""
    rounds: int = 0
    other_load_cores: list[float | None] = Field(
        default_factory=list, description="per measurement, the cores other processes held meanwhile (None: unknown); "
                                          "the one used last")
    alone_us: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="backend -> shape -> us, every shape on that backend, pools as when alone")
    together_us: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="backend -> shape -> us, all candidates in one process, ORT not spinning")
    stall_floor_us: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="backend -> shape -> us no figure was counted below: a stalled pool's cost "
                                          "(TVM: one thread's, where its pool spans every core)")


class NetworkFacts(Facts):
    """Per-network results that belong to no single backend (manifest networks.<n>.facts)."""

    tensorrt_plan: TensorRTPlanFacts | None = None
    pad_gemm: PadGemmFacts | None = None
    precision: PrecisionFacts | None = None
    triton: list[str] = Field(default_factory=list, description="the Triton models written under triton/")
    auto_routes: dict[str, str] = Field(
        default_factory=dict, description="compile's `auto` table: backend per shape label, and 'other'")
    auto_onnxruntime_spinning: bool | None = Field(
        None, description="whether `auto` lets ONNX Runtime spin (only when it is the session's only backend)")
    auto_onnxruntime_threads: int | None = Field(
        None, description="intra-op threads `auto` gives ONNX Runtime (absent: as built), chosen by measurement")
    auto_onnxruntime_shape_threads: dict[str, int] = Field(
        default_factory=dict, description="shape labels where `auto` runs ONNX Runtime on other intra-op threads "
                                          "(1, or 0: its default pool), measured faster there")
    auto_choice: AutoChoiceFacts | None = Field(None, description="what compile measured to choose `auto_routes`")


__all__ = ["ArtifactFacts", "AutoChoiceFacts", "Facts", "FileRef", "NetworkFacts", "PadGemmFacts", "ParityGate",
           "PrecisionFacts", "TensorRTPlanFacts", "VariantParity"]
