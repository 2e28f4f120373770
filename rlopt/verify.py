"""Verification: parity of a backend against recorded PyTorch outputs, and re-checking a whole MODEL_DIR.

`gate_runner` is the one parity gate: compile runs it on every built artifact (rlopt.compile) and
`rlopt verify` re-runs it on a MODEL_DIR, so both check the same code paths the same way.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends import facts_of, import_before_torch, unavailable_reason
from rlopt.backends.base import Infer, Runner
from rlopt.errors import ArtifactError, BackendUnavailable, describe_exception
from rlopt.facts import ArtifactFacts, VariantParity
from rlopt.manifest import FileRecord, NetworkRecord, Parity, checked_file, read_manifest
from rlopt.parity import Tolerance, failure_reasons, run_parity
from rlopt.reference import Reference, one_torch_thread
from rlopt.runtime import open_artifact


def check_parity(infer: Callable[[dict[str, np.ndarray]], list[np.ndarray]], reference: Reference, kind: str,
                 distribution: str, tol: Tolerance) -> Parity:
    """Run every recorded input through `infer` and compare with PyTorch's outputs; a network with recurrent
    state runs every recorded step with the backend's own next state fed back (rlopt.parity.run_parity)."""
    return run_parity(infer, reference, kind, distribution, tol)


@dataclass
class GateResult:
    """What the parity gate found for one runner.

    `parity` is what the artifact's record keeps: the main check's, or a failing required variant's (None when
    the runner raised on the recorded inputs: `error`). `variant_parity` is facts.variant_parity (each a Parity
    record as JSON, or {passed: False, error} for a trick that raised), tricks first. `serving` is the code path
    that serves shapes without their own build (facts-level, after the gate), `serving_infer` its call when this
    runner has it (compile times it at opt for `auto`).
    """

    parity: Parity | None
    variant_parity: dict[str, dict[str, Any]] = field(default_factory=dict)
    serving: str | None = None
    serving_infer: Infer | None = None
    error: str | None = None
    failed_variant: str | None = None

    @property
    def passed(self) -> bool:
        return self.error is None and self.parity is not None and self.parity.passed

    def failure(self, subject: str) -> str | None:
        """One line for the failure list ('<network>/<backend>' or the artifact's path as `subject`), None when the
        gate passed."""
        variant = f" ({self.failed_variant})" if self.failed_variant else ""
        if self.error is not None:
            return f"{subject}{variant}: running the artifact raised {self.error}"
        if self.parity is None or self.parity.passed:
            return None
        return f"{subject}{variant}: parity failed: {failure_reasons(self.parity)}"


def gate_runner(runner: Runner, reference: Reference, kind: str, distribution: str, tolerance: Tolerance, *,
                variant_samples: int | None, facts: ArtifactFacts | None = None,
                trusted: Callable[[str], bool] | None = None, code_unchanged: bool = False) -> GateResult:
    """The parity gate: the runner's main path on every recorded sample, then its tricks, then its required paths.

    1. `runner.infer` on the whole reference must pass; else the gate stops there (a raise is `error`).
    2. Tricks (`gated_variants`, e.g. TVM's padding into a bigger build) run on the first `variant_samples`
       samples per shape; each verdict is recorded and only a passing trick is used later, so a failing (or
       raising) one turns the trick off, not the artifact. With `trusted` (verify), only the tricks it accepts
       (the manifest says they passed) are checked, and one of those failing fails the gate.
    3. Required paths (`parity_variants`, e.g. TVM's dynamic library) must pass: on `variant_samples` samples per
       shape when the path serves other shapes (or nothing else does), else on one (it then serves nothing, and an
       untuned dynamic library can take 100 ms a call). The first failure stops the gate. With `code_unchanged`
       (refit: the same code that passed this gate at compile, only its parameters new, and they are read alike at
       every shape), a path that serves nothing is checked on one sample at the smallest point only.
    `variant_samples` None = every sample. `facts` (the artifact's) say which path serves shapes without a build.
    PyTorch runs on one thread, as when the reference was recorded, so TorchScript is compared bit for bit.
    """
    with one_torch_thread():
        return _gate(runner, reference, kind, distribution, tolerance, variant_samples, facts, trusted,
                     code_unchanged)


def _gate(runner: Runner, reference: Reference, kind: str, distribution: str, tolerance: Tolerance,
          variant_samples: int | None, facts: ArtifactFacts | None,
          trusted: Callable[[str], bool] | None, code_unchanged: bool) -> GateResult:
    try:
        parity = check_parity(runner.infer, reference, kind, distribution, tolerance)
    except Exception as exc:  # the backend itself failed on recorded inputs: a verification failure
        return GateResult(None, error=describe_exception(exc))
    result = GateResult(parity)
    if not parity.passed:
        return result
    head = reference if variant_samples is None else reference.head(variant_samples)
    gated = {name: infer for name, infer in runner.gated_variants().items() if trusted is None or trusted(name)}
    for variant, infer in gated.items():
        try:
            extra = check_parity(infer, head, kind, distribution, tolerance)
        except Exception as exc:  # a trick that cannot run is a trick not used
            result.variant_parity[variant] = {"passed": False, "error": describe_exception(exc)}
            if trusted is not None:
                result.error, result.failed_variant = describe_exception(exc), variant
                return result
            continue
        result.variant_parity[variant] = extra.model_dump(mode="json")
        if trusted is not None and not extra.passed:
            result.parity, result.failed_variant = extra, variant
            return result
    typed = facts if facts is not None else ArtifactFacts()
    verdicts = {**typed.variant_parity, **{k: VariantParity.model_validate(v) for k, v in result.variant_parity.items()}}
    result.serving = typed.model_copy(update={"variant_parity": verdicts}).serving_variant()
    variants = runner.parity_variants()
    for variant, infer in variants.items():
        serves = result.serving in (None, variant)
        samples = variant_samples if serves else 1
        subset = reference if samples is None else reference.head(
            samples, None if serves or not code_unchanged else [reference.smallest_point()])
        try:
            extra = check_parity(infer, subset, kind, distribution, tolerance)
        except Exception as exc:  # a required path that cannot run on recorded inputs fails the gate, named
            result.variant_parity[variant] = {"passed": False, "error": describe_exception(exc)}
            result.error, result.failed_variant = describe_exception(exc), variant
            return result
        result.variant_parity[variant] = extra.model_dump(mode="json")
        if not extra.passed:
            result.parity, result.failed_variant = extra, variant
            return result
    result.serving_infer = {**variants, **gated}.get(result.serving) if result.serving else None
    return result


@dataclass
class Finding:
    """One line of a verify report: a file or a (network, backend) pair, and what was found. `unverified`: an
    artifact this machine cannot run (its sha256 checked, its parity not): ok, except under `--strict`."""

    network: str
    subject: str
    ok: bool
    detail: str
    parity: Parity | None = None
    unverified: bool = False


@dataclass
class VerifyReport:
    model_dir: Path
    findings: list[Finding] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return bool(self.findings) and all(f.ok for f in self.findings)

    @property
    def unverified(self) -> list[Finding]:
        """Artifacts this machine could not check (contract section 7: they fail only `rlopt verify --strict`)."""
        return [f for f in self.findings if f.unverified]

    def as_json(self) -> dict[str, Any]:
        return {"model_dir": str(self.model_dir), "passed": self.passed,
                "unverified": [f"{f.network}/{f.subject}" for f in self.unverified],
                "findings": [{"network": f.network, "subject": f.subject, "ok": f.ok, "detail": f.detail,
                              "unverified": f.unverified,
                              "parity": f.parity.model_dump(mode="json") if f.parity else None}
                             for f in self.findings]}


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
    import_before_torch(manifest.built_backends())
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
            facts = facts_of(backend, artifact.facts)
            reason = unavailable_reason(backend, facts)
            if reason is not None:
                report.findings.append(Finding(name, backend, True, f"unverified here: {reason}", unverified=True))
                continue
            if not reference_ok:
                report.findings.append(Finding(name, backend, False, "parity not re-run: reference.npz is corrupt"))
                continue
            reference = Reference.load(checked_file(model_dir, network.reference), list(network.inputs),
                                       network.outputs)
            try:
                runner = open_artifact(model_dir, backend, artifact, list(network.inputs), facts)
            except BackendUnavailable as exc:  # the gate passed, yet the library could not start (CUDA, say)
                report.findings.append(Finding(name, backend, True, f"unverified here: {exc}", unverified=True))
                continue
            except ArtifactError as exc:
                report.findings.append(Finding(name, backend, False, str(exc)))
                continue
            except Exception as exc:  # the library refused a file whose sha256 matched: it does not run here
                report.findings.append(Finding(name, backend, False,
                                               f"{artifact.path}: opening it raised {describe_exception(exc)}"))
                continue
            gate = facts.parity_gate  # reduced-precision artifacts carry their own gate
            used = Tolerance(gate.atol, gate.rtol, gate.max_kl) if gate else tol
            try:
                # every path `infer` may skip on the reference shapes (TVM's dynamic library), on every sample, and
                # the tricks the manifest says passed the gate (the runtime uses those and only those)
                result = gate_runner(runner, reference, network.kind, network.distribution, used,
                                     variant_samples=None, facts=facts, trusted=facts.gate_passed)
            finally:
                runner.close()
            if result.error is not None:
                report.findings.append(Finding(name, backend, False, result.failure(str(artifact.path)) or ""))
                continue
            parity = result.parity
            assert parity is not None  # set whenever the runner did not raise
            variant = f" ({result.failed_variant})" if result.failed_variant else ""
            detail = f"parity ok over {parity.compared} samples" if parity.passed else \
                f"parity FAILED{variant}: {failure_reasons(parity)}"
            report.findings.append(Finding(name, backend, parity.passed, detail, parity))
    return report
