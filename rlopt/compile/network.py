"""One network, compiled as lists of stages: the front end, then each backend's stages, then verify, then Triton."""

from __future__ import annotations

from typing import Any

from rlopt.backends import BACKENDS, facts_of
from rlopt.compile.engine import Engine
from rlopt.compile.gpu_path import plan_padding, precision_record, write_triton
from rlopt.compile.auto import ChooseAuto
from rlopt.compile.latency import TimeBackends, apply_latencies, timed_backends
from rlopt.compile.measure import VerifyBackend, backend_record
from rlopt.facts import ExportFacts, NetworkFacts, ScriptFacts
from rlopt.manifest import BackendRecord, InputProfile, NetworkRecord, file_record
from rlopt.runtime import ranked_backends
from rlopt.stages.base import Context, Stage, StageOutput, load_stage
from rlopt.stages.frontend import FRONTEND




def backend_stages(backend: str) -> list[Stage]:
    """The stages a backend registered (rlopt/backends/<name>/__init__.py: BACKEND.stages), instantiated."""
    return [load_stage(path)() for path in BACKENDS[backend].stages]


class TritonRepository(Stage):
    """`triton/<model>/config.pbtxt` + `1/model.*` for every verified backend Triton serves."""

    name, inputs = "triton", ("profiles", "reference.npz")

    def __init__(self, artifacts: dict[str, BackendRecord]) -> None:
        self.records = artifacts

    def run(self, ctx: Context) -> StageOutput:
        files = write_triton(ctx.staging, ctx.recipe.name, ctx.name, self.records, ctx.artifacts["profiles"],
                             ctx.reference, ctx.spec)
        ctx.artifacts["triton"] = files
        return StageOutput(None, {})

    def detail(self, ctx: Context, out: StageOutput) -> str:
        return f"{len(ctx.artifacts['triton']) // 2} model(s)"


def compile_network(engine: Engine, ctx: Context, frontend: list[type[Stage]] | None = None) -> NetworkRecord:
    """Front end, every backend of the recipe, verification and latency, Triton, `auto`; failures go to ctx."""
    spec, verify = ctx.spec, ctx.recipe.verify
    ctx.dir.mkdir()
    plan_padding(ctx)
    engine.run_all([stage() for stage in (frontend if frontend is not None else FRONTEND)], ctx)
    artifacts: dict[str, BackendRecord] = {}
    built: dict[str, StageOutput] = {}
    identities: dict[str, Any] = {}
    for backend in ctx.recipe.backends:
        outcome = engine.run_backend(backend, backend_stages(backend), ctx)
        if outcome.output is not None:
            built[backend], identities[backend] = outcome.output, outcome.identity
        else:
            artifacts[backend] = BackendRecord(skipped=outcome.skipped, facts=facts_of(backend, outcome.facts))
        if outcome.failure:
            ctx.failures.append(outcome.failure)
    for backend, output in built.items():
        tol, parity_gate = verify.gate_for(output.facts.precision_built)
        if parity_gate is not None:  # recorded, so `rlopt verify` re-checks with the same tolerances
            output = StageOutput(output.artifact, output.facts.updated(parity_gate=parity_gate))
        out = engine.run(VerifyBackend(backend, output, tol, identities[backend]), ctx)
        assert out is not None
        artifacts[backend], failure = backend_record(ctx, backend, out, output.artifact)
        if failure:
            ctx.failures.append(failure)
    index_ranges = ctx.outputs["onnx"].facts.get("index_ranges", {}) if "onnx" in ctx.outputs else {}
    record = NetworkRecord(
        kind=spec.kind, distribution=spec.distribution, module=spec.module,
        inputs={n: InputProfile(dtype=s.dtype, min=s.dims("min"), opt=s.dims("opt"), max=s.dims("max"),
                                range=s.range, index_range=index_ranges.get(n))
                for n, s in spec.inputs.items()},
        outputs=list(spec.outputs), precision=spec.precision,
        tolerance={"atol": verify.atol, "rtol": verify.rtol, "max_kl": verify.max_kl},
        reference=file_record(ctx.staging, ctx.artifacts["reference.npz"]),
        files={"model.ts": file_record(ctx.staging, ctx.dir / "model.ts"),
               "model.onnx": file_record(ctx.staging, ctx.dir / "model.onnx")},
        artifacts={b: artifacts[b] for b in ctx.recipe.backends},
        stages=ctx.stages,
    )
    if ctx.artifacts.get("model.padded.onnx") is not None:
        record.files["model.padded.onnx"] = file_record(ctx.staging, ctx.artifacts["model.padded.onnx"])
    if timed_backends(record):
        timed = engine.run(TimeBackends(record, identities), ctx)
        assert timed is not None
        apply_latencies(record, timed)
    none = StageOutput(None)
    script, export = ctx.outputs.get("script", none).facts, ctx.outputs.get("onnx", none).facts
    engine.run(TritonRepository(record.artifacts), ctx)
    triton: dict[str, Any] = ctx.artifacts["triton"]
    record.files.update(triton)
    record.facts = NetworkFacts(
        **ctx.facts, precision=precision_record(spec, record.artifacts),
        script=ScriptFacts(**{k: script[k] for k in ScriptFacts.model_fields if k in script}),
        onnx=ExportFacts(**{k: export[k] for k in ExportFacts.model_fields if k in export}),
        triton=sorted({path.split("/")[1] for path in triton}))
    ranked = ranked_backends(record)
    record.selected = ranked[0] if ranked else None
    if ranked:
        auto = engine.run(ChooseAuto(record, identities), ctx)
        assert auto is not None
        record.selected = auto.facts.selected
        record.facts = record.facts.updated(route=auto.facts.route)
    if record.selected is None:
        ctx.failures.append(f"{ctx.name}: no backend was built and verified")
    record.stages = list(ctx.stages)  # with triton's and auto's rows (the record was made before they ran)
    return record


def stage_code_versions() -> dict[str, str]:
    """Every stage's cache name -> its current code version ('verify' stands for every 'verify <backend>')."""
    from rlopt.stages.frontend import FRONTEND_TO_PADDING

    classes = [*FRONTEND, *FRONTEND_TO_PADDING, TritonRepository, VerifyBackend, TimeBackends, ChooseAuto,
               *(load_stage(path) for backend in BACKENDS.values() for path in backend.stages)]
    return {stage.name: stage.code_version() for stage in classes}


def entry_is_current(stage: str, components: dict[str, Any], versions: dict[str, str] | None = None) -> bool:
    """A cache entry made by this rlopt's stage code and these tool versions (else `rlopt cache prune` removes it)."""
    from rlopt.backends import stage_versions

    versions = versions if versions is not None else stage_code_versions()
    name = "verify" if stage.startswith("verify ") else stage
    current = stage_versions(components.get("backend"))
    return components.get("versions") == current and components.get("code") == versions.get(name)


__all__ = ["TritonRepository", "backend_stages", "compile_network", "entry_is_current", "stage_code_versions"]
