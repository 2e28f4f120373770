"""One network of a refit: reference, ONNX graph, padded copy, every backend's artifact, the gate, the drift.

Works on the staging copy of the MODEL_DIR; files are rewritten there, never in the published one.
"""

from __future__ import annotations

import shutil
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.errors import BackendUnavailable, UsageError, located
from rlopt.lazy import require
from rlopt.facts import ArtifactFacts, NetworkFacts, ScriptFacts
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


def repad(folder: Path, facts: NetworkFacts, recipe: Recipe) -> Path:
    """model.padded.onnx rebuilt from the refitted model.onnx with the recorded multiple; the padded dims must
    come out as recorded (the padding plan depends on the graph only)."""
    from rlopt.stages.pad_gemm import pad_model

    onnx = require("onnx")
    recorded = facts.pad_gemm
    model = onnx.load(str(folder / "model.onnx"))
    report = pad_model(model, int(recorded.multiple or 0) if recorded else 0, pad_outputs=recipe.pad_gemm_outputs)
    if recorded is None or report.facts()["padded"] != recorded.padded:
        raise UsageError(located(folder / "model.padded.onnx", "pad_gemm", "re-padding the refitted graph gave other "
                                 "padded dims than the compile recorded", "recompile the MODEL_DIR"))
    path = folder / "model.padded.onnx"
    onnx.save(model, str(path))
    return path


def _state(module: Any) -> dict[str, np.ndarray]:
    return {key: value.detach().cpu().numpy() for key, value in module.state_dict().items()}


def _hook_facts(backend: str, name: str, folder: Path, record: BackendRecord, onnx_path: Path, padded: Path | None,
                state: dict[str, np.ndarray]) -> ArtifactFacts:
    from rlopt.backends import BACKENDS, facts_of
    from rlopt.backends.base import RefitInputs

    hook = BACKENDS[backend].refit_hook()
    assert hook is not None and record.path is not None  # refusal() checked every built artifact has one
    artifact = Path(record.path).relative_to(name).as_posix()
    try:
        return facts_of(backend, hook(RefitInputs(folder, artifact, record.facts, onnx_path, padded, state)))
    except BackendUnavailable as exc:
        raise UsageError(located(folder / artifact, f"networks.{name}.artifacts.{backend}",
                                 f"cannot be refitted on this machine ({exc})",
                                 "refit where the backend runs, or recompile without it")) from None


def gate(staging: Path, backend: str, record: BackendRecord, facts: ArtifactFacts, reference: Reference,
         recipe: Recipe, spec: Any, subject: str, hashes: Hashes, *,
         runner_facts: ArtifactFacts | None = None) -> tuple[BackendRecord, str | None]:
    """The refitted artifact through the parity gate compile uses (rlopt.verify.gate_runner); latency is carried
    over from the old MODEL_DIR (same graph, same code). `runner_facts` (default `facts`) open the runner: refit's
    side-by-side gates open it on one thread (`Backend.one_thread`; the thread count changes no number, see
    docs/refit.md)."""
    from rlopt.backends import open_runner
    from rlopt.verify import gate_runner

    assert record.path is not None
    tol, parity_gate = recipe.verify.gate_for(facts.precision_built)
    if parity_gate is not None:
        facts = facts.updated(parity_gate=parity_gate)
    path = staging / record.path
    current = hashes.record(path)
    new = record.model_copy(update={"sha256": current.sha256, "bytes": current.bytes, "facts": facts})
    runner = open_runner(backend, path, list(spec.inputs), facts if runner_facts is None else runner_facts)
    try:
        result = gate_runner(runner, reference, spec.kind, spec.distribution, tol, variant_samples=VARIANT_SAMPLES,
                             facts=facts, code_unchanged=True)
    finally:
        runner.close()
    new.parity = result.parity
    new.facts = new.facts.with_verdicts(result.variant_parity)
    return new, result.failure(subject)


def gate_cost(record: BackendRecord, reference: Reference) -> float:
    """What a gate of `record` costs, for ordering: compile's median latency at each point times its samples (0
    where compile did not time it)."""
    return sum(record.latency_us[point].p50 * reference.samples(point) for point in reference.points
               if point in record.latency_us)


class NetworkRefit:
    """Network `name` rewritten in `staging` (a copy of MODEL_DIR `source` without the files refit writes anew:
    see `rewritten_anew`) with `model`'s weights, in steps the driver can schedule: `start` (reference re-recorded,
    ONNX graph and padded copy rewritten), `refit_backend` (one artifact's hook and gate: those of `side_by_side`
    on the calling thread alone), `refit_rest` (every other artifact), `finish` (the record, the drift). Gate and
    drift failures go to `failures`; `close` always."""

    def __init__(self, staging: Path, recipe: Recipe, name: str, old: NetworkRecord, model: Any, checkpoint: Path,
                 source: Path) -> None:
        self.staging, self.recipe, self.name, self.old = staging, recipe, name, old
        self.model, self.checkpoint, self.source = model, checkpoint, source
        self.folder = staging / name
        self.failures: list[str] = []
        self.artifacts: dict[str, BackendRecord] = {}
        self.hashes = Hashes(staging)
        # np.savez's CRC, the file write and sha256 release the GIL: 32 MB for the default recipe, written on the
        # other core while the hooks and gates run (they use the in-memory reference)
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="rlopt-reference")

    def start(self) -> None:
        from rlopt.refit.checkpoint import check_state
        from rlopt.stages.weight_map import apply_weight_map
        from rlopt.reference import rerecord_reference
        from rlopt.user_model import submodule

        torch = require("torch")
        spec, name = self.recipe.networks[self.name], self.name
        recipe_path = self.staging / "recipe.yaml"
        self.module = submodule(self.model, spec.module, recipe_path, name)
        compiled = torch.jit.load(str(self.folder / "model.ts"), map_location="cpu")
        check_state(compiled.state_dict(), self.module.state_dict(), self.checkpoint, f"network '{name}'")
        self.old_reference = Reference.load(self.source / self.old.reference.path, list(spec.inputs),
                                            list(spec.outputs))
        with torch.no_grad():
            self.reference = rerecord_reference(self.module, spec, self.old_reference, recipe_path=recipe_path,
                                                network=name)
        self._saved = self._writer.submit(_save_reference, self.reference, self.folder / "reference.npz",
                                          self.staging)
        self.state = _state(self.module)
        assert self.old.facts.onnx is not None and self.old.facts.onnx.weight_map is not None  # refusal() checked
        apply_weight_map(self.folder / "model.onnx", self.old.facts.onnx.weight_map, self.state)
        self.padded = repad(self.folder, self.old.facts, self.recipe) if "model.padded.onnx" in self.old.files \
            else None

    def side_by_side(self) -> list[str]:
        """The built artifacts whose backend can compute on one calling thread (`Backend.one_thread`), the costliest
        gate first: run as jobs on one worker per core, they pack best longest first."""
        from rlopt.backends import BACKENDS

        alone = [backend for backend, record in self.old.artifacts.items()
                 if record.built and backend in BACKENDS and BACKENDS[backend].one_thread is not None]
        return sorted(alone, key=lambda backend: -gate_cost(self.old.artifacts[backend], self.reference))

    def refit_backend(self, backend: str, *, one_thread: bool) -> None:
        """Hook and gate one built artifact; `one_thread`: its runner computes on the calling thread alone."""
        from rlopt.backends import BACKENDS

        spec, record = self.recipe.networks[self.name], self.old.artifacts[backend]
        facts = _hook_facts(backend, self.name, self.folder, record, self.folder / "model.onnx", self.padded,
                            self.state)
        single = BACKENDS[backend].one_thread if one_thread else None
        self.artifacts[backend], failure = gate(self.staging, backend, record, facts, self.reference, self.recipe,
                                                spec, f"{self.name}/{backend}", self.hashes,
                                                runner_facts=single(facts) if single is not None else None)
        if failure:
            self.failures.append(failure)

    def refit_rest(self, done: Iterable[str]) -> None:
        """Every artifact not in `done`: an unbuilt one is carried over, a built one hooked and gated as it runs."""
        for backend, record in self.old.artifacts.items():
            if backend in done:
                continue
            if record.built:
                self.refit_backend(backend, one_thread=False)
            else:
                self.artifacts[backend] = record

    def finish(self) -> NetworkRecord:
        from rlopt.refit.drift import reference_drift
        from rlopt.stages.script import weights_sha256

        old, spec = self.old, self.recipe.networks[self.name]
        copies = _refresh_copies(self.staging, old)
        new = old.model_copy(deep=True, update={"artifacts": {b: self.artifacts[b] for b in old.artifacts}})
        new.files = {key: _file_entry(self.hashes, self.staging, record.path, copies.get(record.path))
                     for key, record in old.files.items()}
        script = new.facts.script or ScriptFacts()
        new.facts = new.facts.updated(script=script.updated(weights_sha256=weights_sha256(self.module)))
        new.reference = self._saved.result()
        if spec.kind == "policy":
            new.drift = reference_drift(self.old_reference, self.reference, spec.distribution)
            limit = self.recipe.verify.max_drift_kl
            if limit is not None and new.drift.kl_mean > limit:
                self.failures.append(f"{self.name}: policy drift KL(old || new) {new.drift.kl_mean:.3g} > "
                                     f"verify.max_drift_kl {limit:g}")
        return new

    def close(self) -> None:
        self._writer.shutdown(wait=True)


def _save_reference(reference: Reference, path: Path, staging: Path) -> FileRecord:
    reference.save(path)
    return file_record(staging, path)


def copies_of(old: NetworkRecord) -> dict[str, str]:
    """{copy: source} for the files that are byte copies of another file, artifact or artifact's companion file of the
    network (Triton's model.pt / model.onnx / model.plan and the files placed beside them), found by the sha256 the
    old manifest recorded for both."""
    from rlopt.backends import facts_of

    companions = [ref for backend, record in old.artifacts.items() if record.built
                  for ref in facts_of(backend, record.facts).companion_files()]
    before = {record.sha256: record.path for record in [*old.files.values(), *old.artifacts.values(), *companions]
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


__all__ = ["Hashes", "NetworkRefit", "copies_of", "gate", "gate_cost", "repad"]
