"""Verification: parity of a backend against recorded PyTorch outputs, and re-checking a whole MODEL_DIR."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

from rlopt.errors import ArtifactError, BackendUnavailable
from rlopt.manifest import FileRecord, NetworkRecord, Parity, checked_file, read_manifest
from rlopt.parity import ParityAccumulator, Tolerance
from rlopt.reference import Reference
from rlopt.runtime import open_artifact
from rlopt.backends import unavailable_reason
from rlopt.backends.tvm.runner import gate_passed


def check_parity(infer: Callable[[dict[str, np.ndarray]], list[np.ndarray]], reference: Reference, kind: str,
                 distribution: str, tol: Tolerance) -> Parity:
    """Run every recorded input through `infer` and compare with PyTorch's outputs."""
    accumulator = ParityAccumulator(kind, distribution, reference.output_names, tol)
    accumulator.shapes = [f"{point} {reference.shape(point)}" for point in reference.points]
    for _point, feeds, expected in reference.pairs():
        accumulator.add(expected, infer(feeds))
    return accumulator.result()


@dataclass
class Finding:
    """One line of a verify report: a file or a (network, backend) pair, and what was found."""

    network: str
    subject: str
    ok: bool
    detail: str
    parity: Parity | None = None


@dataclass
class VerifyReport:
    model_dir: Path
    findings: list[Finding] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.findings) and all(f.ok for f in self.findings)


def tolerance_of(network: NetworkRecord) -> Tolerance:
    return Tolerance(network.tolerance["atol"], network.tolerance["rtol"], network.tolerance["max_kl"])


def _check_file(model_dir: Path, network: str, record: FileRecord, report: VerifyReport) -> bool:
    try:
        checked_file(model_dir, record)
    except ArtifactError as exc:
        report.findings.append(Finding(network, record.path, False, str(exc)))
        return False
    report.findings.append(Finding(network, record.path, True, "sha256 ok"))
    return True


def verify_model_dir(model_dir: Path | str) -> VerifyReport:
    """Re-hash every file listed in the manifest, then re-run parity of every runnable backend."""
    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    report = VerifyReport(model_dir)
    _check_file(model_dir, "", manifest.recipe, report)
    for name, network in manifest.networks.items():
        reference_ok = _check_file(model_dir, name, network.reference, report)
        for record in network.files.values():
            _check_file(model_dir, name, record, report)
        tol = tolerance_of(network)
        for backend, artifact in network.artifacts.items():
            if not artifact.built:
                continue
            try:
                checked_file(model_dir, artifact)
            except ArtifactError as exc:
                report.findings.append(Finding(name, backend, False, str(exc)))
                continue
            reason = unavailable_reason(backend, artifact.facts)
            if reason is not None:
                report.findings.append(Finding(name, backend, True, f"sha256 ok; parity not re-run here: {reason}"))
                continue
            if not reference_ok:
                report.findings.append(Finding(name, backend, False, "parity not re-run: reference.npz is corrupt"))
                continue
            reference = Reference.load(checked_file(model_dir, network.reference), list(network.inputs),
                                       network.outputs)
            try:
                runner = open_artifact(model_dir, backend, artifact, list(network.inputs))
            except (ArtifactError, BackendUnavailable) as exc:
                report.findings.append(Finding(name, backend, False, str(exc)))
                continue
            try:
                gate = artifact.facts.get("parity_gate")  # reduced-precision artifacts carry their own gate
                used = Tolerance(gate["atol"], gate["rtol"], gate["max_kl"]) if gate else tol
                parity = check_parity(runner.infer, reference, network.kind, network.distribution, used)
                # paths infer skips on the reference shapes (TVM's dynamic fallback) are re-checked too
                # and the tricks the manifest says passed the gate (the runtime uses those and only those)
                gated = {name: infer for name, infer in runner.gated_variants().items()
                         if gate_passed(artifact.facts, name)}
                for infer in [*runner.parity_variants().values(), *gated.values()]:
                    extra = check_parity(infer, reference, network.kind, network.distribution, used)
                    parity = parity if extra.passed else extra
            finally:
                runner.close()
            detail = f"parity ok over {parity.compared} samples" if parity.passed else "parity FAILED"
            report.findings.append(Finding(name, backend, parity.passed, detail, parity))
    return report
