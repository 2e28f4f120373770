"""Typed facts: what compile records about an artifact or a network, and what the runtime reads back.

The manifest stores these models (`rlopt.manifest`): a writer builds one, the manifest validates every `facts` object
against its model when it is read, and readers use attributes. Every model refuses a key it does not declare
(extra="forbid"), so a misspelled fact fails where it is written or read. Each backend's artifact model lives beside
its runner (`rlopt/backends/<name>/facts.py`, named by its `Backend.facts`); the network-level facts and the base
every backend's model extends live here.

Imports nothing but pydantic and the parity models: the runtime reads these without torch, tvm or compile code.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Self

from pydantic import BaseModel, ConfigDict, Field

from rlopt.files import FileRecord
from rlopt.parity import OutputParity

OTHER = "other"  # a route's pseudo-shape: every shape without a named point of its own


class Facts(BaseModel):
    """A `facts` object: declared keys only, type-checked; `as_dict` gives back exactly the keys that were set."""

    model_config = ConfigDict(extra="forbid")

    @classmethod
    def of(cls, facts: Facts | Mapping[str, Any] | None) -> Self:
        """`facts` as this model: a model of this class is returned as is, a dict (or another Facts) is validated."""
        if isinstance(facts, cls):
            return facts
        if isinstance(facts, Facts):
            return cls.model_validate(facts.as_dict())
        # a mapping is copied; anything else (a manifest's `facts: true`) goes to pydantic as is, which refuses it
        return cls.model_validate(dict(facts) if isinstance(facts, Mapping) else {} if facts is None else facts)

    def as_dict(self) -> dict[str, Any]:
        """The JSON object: only keys that were given (defaults are not added)."""
        return self.model_dump(mode="json", exclude_unset=True)

    def updated(self, **fields: Any) -> Self:
        """A copy with `fields` set (validated: an undeclared or wrong-typed fact fails here)."""
        return type(self).model_validate({**self.as_dict(), **_json(fields)})


def _json(fields: dict[str, Any]) -> dict[str, Any]:
    return {key: value.as_dict() if isinstance(value, Facts) else
            value.model_dump(mode="json") if isinstance(value, BaseModel) else value for key, value in fields.items()}


class ParityGate(Facts):
    """The tolerances a reduced-precision artifact was gated with; `rlopt verify` re-checks with the same ones."""

    atol: float
    rtol: float
    max_kl: float
    why: str = ""


class VariantParity(Facts):
    """The parity gate's verdict on one code path of an artifact: a Parity record, or `error` when it raised."""

    passed: bool = False
    error: str | None = None
    max_abs: float | None = None
    max_rel: float | None = None
    kl: float | None = None
    argmax_agree: float | None = None
    compared: int | None = None
    shapes: list[str] | None = None
    outputs: list[OutputParity] | None = None


class GpuIdentity(Facts):
    """The GPU an artifact was built and verified on (rlopt.machine.gpu_identity); `rlopt inspect` shows it."""

    name: str | None = None
    compute_capability: str | None = None
    driver: str | None = None
    cuda_runtime: str | None = Field(None, description="the CUDA runtime of torch's build")
    tensorrt: str | None = None

    def line(self) -> str:
        """'GPU NVIDIA A10G (compute 8.6), driver 550.54.15, CUDA 12.8, TensorRT 10.13.3.9': where it was built."""
        parts = [f"driver {self.driver}" if self.driver else "", f"CUDA {self.cuda_runtime}" if self.cuda_runtime else "",
                 f"TensorRT {self.tensorrt}" if self.tensorrt else ""]
        compute = f" (compute {self.compute_capability})" if self.compute_capability else ""
        return f"GPU {self.name or '(name unknown)'}{compute}" + "".join(f", {part}" for part in parts if part)


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

    def with_verdicts(self, verdicts: Mapping[str, Any]) -> Self:
        """A copy with the parity gate's `verdicts` (code path -> Parity record or {passed, error}) recorded."""
        if not verdicts:
            return self
        merged = {**{k: v.as_dict() for k, v in self.variant_parity.items()}, **verdicts}
        return self.updated(variant_parity=merged)

    def companion_files(self) -> list[FileRecord]:
        """Files that travel with the artifact and are loaded with it (checked like it); none by default."""
        return []

    def files_serving(self, point: str) -> list[FileRecord] | None:
        """The companion files that alone compute named point `point`, or None: the artifact itself (and every
        companion) serves it. How refit's latency check tells which bytes a timing at a shape ran."""
        return None

    def summary(self) -> list[str]:
        """Lines `rlopt inspect` shows for the artifact beyond its parity and latency: the GPU it was built on."""
        return [self.gpu.line()] if self.gpu is not None else []

    def serving_variant(self) -> str | None:
        """The code path (a `variant_parity` key) that serves shapes without a build of their own, None where the
        artifact itself serves every shape (TVM: its padded or dynamic library)."""
        return None

    def route_detail(self, label: str) -> str:
        """How the artifact runs at shape label `label` once a route's options are applied, beyond its backend's name
        ('' when nothing more): what `rlopt diff` names a route by."""
        return ""

    def gate_passed(self, variant: str) -> bool:
        """Whether compile's parity gate passed `variant` (variant_parity.<variant>.passed)."""
        verdict = self.variant_parity.get(variant)
        return verdict is not None and verdict.passed


class ModelSourceFacts(Facts):
    """How `rlopt refit` rebuilds the eager model: a factory (its file made absolute), kwargs and seed; or an SB3 zip."""

    factory: str | None = None
    kwargs: dict[str, Any] | None = None
    seed: int | None = None
    sb3: bool | None = None


class ScriptFacts(Facts):
    """The scripted module's digests: the graph (code) and the weights apart, so a refit keeps the first."""

    graph_sha256: str | None = None
    weights_sha256: str | None = None


class ExportFacts(Facts):
    """How the ONNX graph was exported, and the map refit writes new weights through."""

    exporter: str | None = None
    export_path: str | None = Field(None, description="script, trace or dynamo")
    refused: str | None = Field(None, description="what the TorchScript exporter refused, when it did")
    trace_refused: str | None = None
    dynamo_refused: str | None = None
    shape_probe: dict[str, Any] | None = Field(None, description="rlopt.stages.shape_probe: the shapes the graph ran at")
    weight_map: dict[str, Any] | None = Field(None, description="rlopt.stages.weight_map: initializer -> state key")


class PadGemmFacts(Facts):
    """GEMM padding of the exported graph: what was padded, skipped and sliced, and how exact it stayed."""

    applied: bool = False
    pad_gemm: int | str | None = Field(None, description="the recipe's setting, when nothing was padded")
    reason: str | None = None
    dropped: str | None = Field(None, description="why the padded graph was not kept (not exact)")
    multiple: int | None = None
    padded: list[Any] | None = None
    sliced_outputs: list[Any] | None = None
    skipped: list[Any] | None = None
    already_aligned: Any = None
    exactness: dict[str, Any] | None = Field(None, description="max |padded - unpadded| on the reference inputs")


class PrecisionFacts(Facts):
    """What each backend did with the network's requested precision (network facts.precision)."""

    requested: str | None = None
    backends: dict[str, str] = Field(default_factory=dict)


class AutoChoiceFacts(Facts):
    """Why `auto` runs the route it runs: median latency per shape label ('other': shapes without a point of their
    own) of each candidate backend, measured in interleaved rounds in the two configurations a session can run, in
    passes until the route they decide stops changing; and when, on how many cores and under which load."""

    mixed: bool = False
    reason: str = ""
    rounds: int = 0
    measured_at: str | None = Field(None, description="when the routes were measured (UTC, ISO 8601)")
    cores: int | None = Field(None, description="the cores the measuring process could use")
    load_average: list[float] | None = Field(None, description="the machine's 1/5/15-minute load average then")
    passes: int = Field(0, description="measuring passes taken (each: interleaved rounds of every configuration)")
    stable: bool | None = Field(None, description="whether the last pass left the route as the passes before it "
                                                  "decided (False: the route of every kept pass pooled, flagged)")
    other_load_cores: list[float | None] = Field(
        default_factory=list, description="per pass, in order, the cores other processes (or the hypervisor) held "
                                          "meanwhile (None: unknown); passes far more loaded than the least loaded "
                                          "one are not pooled")
    aa_noise: dict[str, float] = Field(
        default_factory=dict, description="shape -> max(A/A, 1 / A/A) of one configuration timed twice: how much "
                                          "faster another must be to take that shape")
    alone_us: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="candidate -> shape -> us, every shape alone, pools as when alone (a "
                                          "backend's other configurations: '<backend> <configuration>')")
    together_us: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="candidate -> shape -> us, all candidates in one process, each configured "
                                          "as a mixed route opens it")
    cpu_us: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="configuration computing on the calling thread alone -> shape -> its CPU "
                                          "time per call, us (other processes' load does not move it)")
    stall_floor_us: dict[str, dict[str, float]] = Field(
        default_factory=dict, description="read from MODEL_DIRs whose `auto` counted a TVM pool at one thread's "
                                          "latency; a route now runs TVM on one thread (not written)")

    def measured_line(self) -> str:
        """When and under which load the routes were measured, in one line ('' where the manifest does not say)."""
        if self.measured_at is None:
            return ""
        loads = [x for x in self.other_load_cores if x is not None]
        parts = [f"measured {self.measured_at}" + (f" on {self.cores} cores" if self.cores else "")]
        if loads:
            held = f"{min(loads):.2f}" + (f"-{max(loads):.2f}" if max(loads) > min(loads) else "")
            parts.append(f"other processes held {held} cores")
        if self.load_average:
            parts.append("load average " + " ".join(f"{x:g}" for x in self.load_average))
        if self.passes:
            parts.append(f"{self.passes} passes, " + ("stable" if self.stable else "not stable"))
        if self.aa_noise:
            parts.append(f"A/A noise up to {max(self.aa_noise.values()):.2f}x")
        return ", ".join(parts)


class RoutePlan(Facts):
    """`auto`'s route, decided at compile time: a backend per named shape label and one for every other shape
    (OTHER), and the facts each backend of the route is opened with where they differ from its artifact's (its
    threads, whether its pool spins beside another backend's). The runtime loads exactly this (`recorded_plan`)."""

    routes: dict[str, str] = Field(description="shape label (and 'other') -> backend")
    options: dict[str, dict[str, Any]] = Field(
        default_factory=dict, description="backend -> the facts its route opens it with, over its artifact's "
                                          "(checked against the backend's facts model)")
    choice: AutoChoiceFacts | None = Field(None, description="what compile measured to choose the route")

    @property
    def backends(self) -> set[str]:
        return set(self.routes.values())


class AutoStageFacts(Facts):
    """What the `auto` stage outputs (and the stage cache keeps): the route and the backend at the opt shape."""

    route: RoutePlan
    selected: str | None = None


class NetworkFacts(Facts):
    """Per-network results that belong to no single backend (manifest networks.<n>.facts)."""

    model_source: ModelSourceFacts | None = None
    script: ScriptFacts | None = None
    onnx: ExportFacts | None = None
    profiles: list[dict[str, dict[str, list[int]]]] = Field(
        default_factory=list, description="the inputs' shape profiles (min/opt/max; profile 0 first), as validated")
    pad_gemm: PadGemmFacts | None = None
    precision: PrecisionFacts | None = None
    triton: list[str] = Field(default_factory=list, description="the Triton models written under triton/")
    route: RoutePlan | None = Field(None, description="`auto`'s route (absent: no backend was verified)")
    rollout: dict[str, Any] | None = Field(None, description="SB3 agents: each backend's rollout against predict")
    rollout_reference: dict[str, Any] | None = Field(None, description="what of the rollout joined reference.npz")


__all__ = ["OTHER", "ArtifactFacts", "AutoChoiceFacts", "AutoStageFacts", "ExportFacts", "Facts", "GpuIdentity", "ModelSourceFacts",
           "NetworkFacts", "PadGemmFacts", "ParityGate", "PrecisionFacts", "RoutePlan", "ScriptFacts", "VariantParity"]
