"""One network of a refit: reference, ONNX graph, padded copy, every backend's artifact, the gate, the drift.

Works on the staging copy of the MODEL_DIR; files are rewritten there, never in the published one.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.errors import BackendUnavailable, UsageError, located
from rlopt.lazy import require
from rlopt.manifest import BackendRecord, NetworkRecord, file_record
from rlopt.recipe import Recipe
from rlopt.reference import Reference

VARIANT_SAMPLES = 4  # as compile's `verify <backend>` stage


def repad(folder: Path, facts: dict[str, Any], recipe: Recipe) -> Path:
    """model.padded.onnx rebuilt from the refitted model.onnx with the recorded multiple; the padded dims must
    come out as recorded (the padding plan depends on the graph only)."""
    from rlopt.stages.pad_gemm import pad_model

    onnx = require("onnx")
    recorded = facts.get("pad_gemm") or {}
    model = onnx.load(str(folder / "model.onnx"))
    report = pad_model(model, int(recorded["multiple"]), pad_outputs=recipe.pad_gemm_outputs)
    if report.facts()["padded"] != recorded.get("padded"):
        raise UsageError(located(folder / "model.padded.onnx", "pad_gemm", "re-padding the refitted graph gave other "
                                 "padded dims than the compile recorded", "recompile the MODEL_DIR"))
    path = folder / "model.padded.onnx"
    onnx.save(model, str(path))
    return path


def _state(module: Any) -> dict[str, np.ndarray]:
    return {key: value.detach().cpu().numpy() for key, value in module.state_dict().items()}


def _hook_facts(backend: str, name: str, folder: Path, record: BackendRecord, onnx_path: Path, padded: Path | None,
                state: dict[str, np.ndarray], reference: Path) -> dict[str, Any]:
    from rlopt.backends import BACKENDS, facts_of
    from rlopt.backends.base import RefitInputs

    hook = BACKENDS[backend].refit_hook()
    assert hook is not None and record.path is not None  # refusal() checked every built artifact has one
    artifact = Path(record.path).relative_to(name).as_posix()
    try:
        return dict(hook(RefitInputs(folder, artifact, facts_of(backend, record.facts), onnx_path, padded, state,
                                     reference)))
    except BackendUnavailable as exc:
        raise UsageError(located(folder / artifact, f"networks.{name}.artifacts.{backend}",
                                 f"cannot be refitted on this machine ({exc})",
                                 "refit where the backend runs, or recompile without it")) from None


def gate(staging: Path, backend: str, record: BackendRecord, facts: dict[str, Any], reference: Reference,
         recipe: Recipe, spec: Any, subject: str) -> tuple[BackendRecord, str | None]:
    """The refitted artifact through the parity gate compile uses (rlopt.verify.gate_runner); latency is carried
    over from the old MODEL_DIR (same graph, same code)."""
    from rlopt.backends import open_runner
    from rlopt.compile.gpu_path import tolerance_for
    from rlopt.verify import gate_runner

    assert record.path is not None
    tol = tolerance_for(facts, recipe.verify)
    path = staging / record.path
    current = file_record(staging, path)
    new = record.model_copy(update={"sha256": current.sha256, "bytes": current.bytes, "facts": facts})
    runner = open_runner(backend, path, list(spec.inputs), facts)
    try:
        result = gate_runner(runner, reference, spec.kind, spec.distribution, tol, variant_samples=VARIANT_SAMPLES,
                             facts=facts)
    finally:
        runner.close()
    new.parity = result.parity
    if result.variant_parity:
        new.facts.setdefault("variant_parity", {}).update(result.variant_parity)
    return new, result.failure(subject)


def refit_network(staging: Path, recipe: Recipe, name: str, old: NetworkRecord, model: Any, checkpoint: Path,
                  failures: list[str]) -> NetworkRecord:
    """Rewrite network `name` in `staging` with `model`'s weights; gate and drift failures go to `failures`."""
    from rlopt.refit.checkpoint import check_state
    from rlopt.refit.drift import reference_drift
    from rlopt.refit.weight_map import apply_weight_map
    from rlopt.reference import rerecord_reference
    from rlopt.stages.load_model import submodule
    from rlopt.stages.script import weights_sha256

    torch = require("torch")
    spec, verify, folder = recipe.networks[name], recipe.verify, staging / name
    recipe_path = staging / "recipe.yaml"
    module = submodule(model, spec.module, recipe_path, name)
    compiled = torch.jit.load(str(folder / "model.ts"), map_location="cpu")
    check_state(compiled.state_dict(), module.state_dict(), checkpoint, f"network '{name}'")
    state = _state(module)
    inputs, outputs = list(spec.inputs), list(spec.outputs)
    old_reference = Reference.load(folder / "reference.npz", inputs, outputs)
    with torch.no_grad():
        reference = rerecord_reference(module, spec, old_reference, recipe_path=recipe_path, network=name)
    reference.save(folder / "reference.npz")
    apply_weight_map(folder / "model.onnx", old.facts["onnx"]["weight_map"], state)
    padded = repad(folder, old.facts, recipe) if "model.padded.onnx" in old.files else None
    before = {record.sha256: record.path for record in [*old.files.values(), *old.artifacts.values()]
              if record.path and not record.path.startswith("triton/")}
    artifacts: dict[str, BackendRecord] = {}
    for backend, record in old.artifacts.items():
        if not record.built:
            artifacts[backend] = record
            continue
        facts = _hook_facts(backend, name, folder, record, folder / "model.onnx", padded, state,
                            folder / "reference.npz")
        artifacts[backend], failure = gate(staging, backend, record, facts, reference, recipe, spec,
                                           f"{name}/{backend}")
        if failure:
            failures.append(failure)
    _refresh_copies(staging, old, before)
    new = old.model_copy(deep=True, update={"artifacts": artifacts})
    new.reference = file_record(staging, folder / "reference.npz")
    new.files = {key: file_record(staging, staging / record.path) for key, record in old.files.items()}
    new.facts["script"] = {**old.facts.get("script", {}), "weights_sha256": weights_sha256(module)}
    if spec.kind == "policy":
        new.drift = reference_drift(old_reference, reference, spec.distribution)
        limit = verify.max_drift_kl
        if limit is not None and new.drift.kl_mean > limit:
            failures.append(f"{name}: policy drift KL(old || new) {new.drift.kl_mean:.3g} > verify.max_drift_kl "
                            f"{limit:g}")
    return new


def _refresh_copies(staging: Path, old: NetworkRecord, before: dict[str, str | None]) -> None:
    """Files that were byte copies of a rewritten artifact (Triton's model.pt / model.onnx / model.plan) get the
    new bytes: a copy is found by the sha256 the old manifest recorded for both."""
    for record in old.files.values():
        source = before.get(record.sha256)
        if source is not None and source != record.path:
            shutil.copyfile(staging / source, staging / record.path)


__all__ = ["gate", "refit_network", "repad"]
