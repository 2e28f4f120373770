"""One network of a refit: reference, ONNX graph, padded copy, every backend's artifact, the gate, the drift.

Works on the staging copy of the MODEL_DIR; files are rewritten there, never in the published one.
"""

from __future__ import annotations

import shutil
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.errors import BackendUnavailable, UsageError, located
from rlopt.lazy import require
from rlopt.manifest import BackendRecord, FileRecord, NetworkRecord, file_record
from rlopt.recipe import Recipe
from rlopt.reference import Reference

VARIANT_SAMPLES = 4  # as compile's `verify <backend>` stage


class Hashes:
    """Each file the refit wrote, hashed once: the gate's record of an artifact serves the manifest's `files`
    entry of the same path, and a byte copy (Triton's) takes its source's sha256. An entry is used only while the
    file's size and mtime are those it was hashed at."""

    def __init__(self, staging: Path) -> None:
        self.staging = staging
        self._records: dict[str, tuple[tuple[int, int], FileRecord]] = {}

    def record(self, path: Path) -> FileRecord:
        stat = path.stat()
        key = path.relative_to(self.staging).as_posix()
        known = self._records.get(key)
        if known is not None and known[0] == (stat.st_size, stat.st_mtime_ns):
            return known[1]
        record = file_record(self.staging, path)
        self._records[key] = ((stat.st_size, stat.st_mtime_ns), record)
        return record


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
                state: dict[str, np.ndarray]) -> dict[str, Any]:
    from rlopt.backends import BACKENDS, facts_of
    from rlopt.backends.base import RefitInputs

    hook = BACKENDS[backend].refit_hook()
    assert hook is not None and record.path is not None  # refusal() checked every built artifact has one
    artifact = Path(record.path).relative_to(name).as_posix()
    try:
        return dict(hook(RefitInputs(folder, artifact, facts_of(backend, record.facts), onnx_path, padded, state)))
    except BackendUnavailable as exc:
        raise UsageError(located(folder / artifact, f"networks.{name}.artifacts.{backend}",
                                 f"cannot be refitted on this machine ({exc})",
                                 "refit where the backend runs, or recompile without it")) from None


def gate(staging: Path, backend: str, record: BackendRecord, facts: dict[str, Any], reference: Reference,
         recipe: Recipe, spec: Any, subject: str, hashes: Hashes) -> tuple[BackendRecord, str | None]:
    """The refitted artifact through the parity gate compile uses (rlopt.verify.gate_runner); latency is carried
    over from the old MODEL_DIR (same graph, same code)."""
    from rlopt.backends import open_runner
    from rlopt.compile.gpu_path import tolerance_for
    from rlopt.verify import gate_runner

    assert record.path is not None
    tol = tolerance_for(facts, recipe.verify)
    path = staging / record.path
    current = hashes.record(path)
    new = record.model_copy(update={"sha256": current.sha256, "bytes": current.bytes, "facts": facts})
    runner = open_runner(backend, path, list(spec.inputs), facts)
    try:
        result = gate_runner(runner, reference, spec.kind, spec.distribution, tol, variant_samples=VARIANT_SAMPLES,
                             facts=facts, code_unchanged=True)
    finally:
        runner.close()
    new.parity = result.parity
    if result.variant_parity:
        new.facts.setdefault("variant_parity", {}).update(result.variant_parity)
    return new, result.failure(subject)


def refit_network(staging: Path, recipe: Recipe, name: str, old: NetworkRecord, model: Any, checkpoint: Path,
                  failures: list[str], source: Path) -> NetworkRecord:
    """Rewrite network `name` in `staging` (a copy of MODEL_DIR `source` without the files refit writes anew:
    see `rewritten_anew`) with `model`'s weights; gate and drift failures go to `failures`."""
    from rlopt.refit.checkpoint import check_state
    from rlopt.refit.drift import reference_drift
    from rlopt.reference import rerecord_reference
    from rlopt.stages.load_model import submodule

    torch = require("torch")
    spec, verify, folder = recipe.networks[name], recipe.verify, staging / name
    recipe_path = staging / "recipe.yaml"
    module = submodule(model, spec.module, recipe_path, name)
    compiled = torch.jit.load(str(folder / "model.ts"), map_location="cpu")
    check_state(compiled.state_dict(), module.state_dict(), checkpoint, f"network '{name}'")
    inputs, outputs = list(spec.inputs), list(spec.outputs)
    old_reference = Reference.load(source / old.reference.path, inputs, outputs)
    with torch.no_grad():
        reference = rerecord_reference(module, spec, old_reference, recipe_path=recipe_path, network=name)
    with ThreadPoolExecutor(1, thread_name_prefix="rlopt-reference") as writer:
        # np.savez's CRC, the file write and sha256 release the GIL: 32 MB for the default recipe, written on
        # the other core while the hooks and gates run (they use the in-memory reference)
        saved = writer.submit(_save_reference, reference, folder / "reference.npz", staging)
        new = _refit_artifacts(staging, recipe, name, old, module, reference, failures)
        new.reference = saved.result()
    if spec.kind == "policy":
        new.drift = reference_drift(old_reference, reference, spec.distribution)
        limit = verify.max_drift_kl
        if limit is not None and new.drift.kl_mean > limit:
            failures.append(f"{name}: policy drift KL(old || new) {new.drift.kl_mean:.3g} > verify.max_drift_kl "
                            f"{limit:g}")
    return new


def _save_reference(reference: Reference, path: Path, staging: Path) -> FileRecord:
    reference.save(path)
    return file_record(staging, path)


def _refit_artifacts(staging: Path, recipe: Recipe, name: str, old: NetworkRecord, module: Any, reference: Reference,
                     failures: list[str]) -> NetworkRecord:
    """The ONNX graph, its padded copy and every built artifact rewritten, each artifact gated; the file records."""
    from rlopt.refit.weight_map import apply_weight_map
    from rlopt.stages.script import weights_sha256

    spec, folder, state = recipe.networks[name], staging / name, _state(module)
    apply_weight_map(folder / "model.onnx", old.facts["onnx"]["weight_map"], state)
    padded = repad(folder, old.facts, recipe) if "model.padded.onnx" in old.files else None
    artifacts: dict[str, BackendRecord] = {}
    hashes = Hashes(staging)
    for backend, record in old.artifacts.items():
        if not record.built:
            artifacts[backend] = record
            continue
        facts = _hook_facts(backend, name, folder, record, folder / "model.onnx", padded, state)
        artifacts[backend], failure = gate(staging, backend, record, facts, reference, recipe, spec,
                                           f"{name}/{backend}", hashes)
        if failure:
            failures.append(failure)
    copies = _refresh_copies(staging, old)
    new = old.model_copy(deep=True, update={"artifacts": artifacts})
    new.files = {key: _file_entry(hashes, staging, record.path, copies.get(record.path))
                 for key, record in old.files.items()}
    new.facts["script"] = {**old.facts.get("script", {}), "weights_sha256": weights_sha256(module)}
    return new


def copies_of(old: NetworkRecord) -> dict[str, str]:
    """{copy: source} for the files that are byte copies of another file or artifact of the network (Triton's
    model.pt / model.onnx / model.plan), found by the sha256 the old manifest recorded for both."""
    before = {record.sha256: record.path for record in [*old.files.values(), *old.artifacts.values()]
              if record.path and not record.path.startswith("triton/")}
    return {record.path: before[record.sha256] for record in old.files.values()
            if before.get(record.sha256) not in (None, record.path)}


def _refresh_copies(staging: Path, old: NetworkRecord) -> dict[str, str]:
    """Byte copies of a rewritten artifact get the new bytes; returns {copy: source}."""
    copies = copies_of(old)
    for copy, source in copies.items():
        shutil.copyfile(staging / source, staging / copy)
    return copies


def _file_entry(hashes: Hashes, staging: Path, path: str, source: str | None) -> FileRecord:
    """The manifest's record of `path`: a copy's is its source's sha256 and size (copyfile wrote those bytes)."""
    if source is None:
        return hashes.record(staging / path)
    record = hashes.record(staging / source)
    return record.model_copy(update={"path": path})


__all__ = ["Hashes", "copies_of", "gate", "refit_network", "repad"]
