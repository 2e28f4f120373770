"""Bench candidates: which to run (in the parent, from the manifest alone) and how a worker opens each one.

Candidates, per network:
- each backend built, verified and runnable here, through `rlopt.load` (numpy in, numpy out: what
  users call), and `rlopt.load(..., backend="auto")`, which shows what auto gives at each shape;
- PyTorch eager: the model rebuilt from the recipe. A MODEL_DIR does not hold model code, and a
  recipe's file factory is relative to the ORIGINAL recipe, so eager needs `--recipe` (the one
  given to `rlopt compile`); its `model` section must equal MODEL_DIR/recipe.yaml's and the
  rebuilt module must reproduce reference.npz, else eager is skipped with the reason. A factory
  given as an importable module (`pkg.module:callable`) needs no `--recipe`;
- the TorchScript module (model.ts) called directly with torch tensors;
- `torch.compile` of the eager module (inductor; its compile time is reported, not timed);
- ONNX Runtime on the exported model.onnx with ORT_ENABLE_ALL at 1 intra-op thread and at all
  usable cores;
- for a MODEL_DIR compiled from an SB3 zip, its actor: `sb3 predict`, SB3's own
  `model.predict(obs, deterministic=True)` on the zip the recipe names.
The protocol set (`protocol=True`, scripts/bench.py) keeps what its ratios need: `rlopt auto`, eager, both
ONNX Runtime sessions and an A/A twin of each (the same session in another process: the run's noise), and
`sb3 predict`.
Torch candidates get torch tensors made once per shape (`torch.from_numpy`, no copy), ONNX Runtime
candidates numpy arrays: each is called the way its users call it.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np

from rlopt.errors import ArtifactError, BackendUnavailable, RloptError, UsageError, located
from rlopt.lazy import require
from rlopt.manifest import Manifest, NetworkRecord, checked_file, read_manifest
from rlopt.reference import Reference
from rlopt.backends import unavailable_reason
from rlopt.tools.bench.schema import Skip

Call = Callable[[], object]


CandidateKind = Literal["rlopt", "eager", "torch.compile", "torchscript module", "onnx session", "sb3", "factory"]


@dataclass(frozen=True)
class CandidateSpec:
    """What a worker builds, picklable: `kind` picks the opener (see OPENERS), the rest are its arguments.

    kind "factory" calls `factory` ("module:function", taking the spec and returning an OpenCandidate): a way
    to bench something rlopt does not know (tests use it for a candidate that crashes its process).
    """

    name: str
    group: str
    note: str
    kind: CandidateKind
    model_dir: str
    network: str
    backend: str | None = None
    threads: int | None = None
    recipe: str | None = None
    factory: str | None = None


@dataclass
class OpenCandidate:
    """A candidate opened in its worker: `prepare(feeds)` returns a zero-argument call bound to those inputs."""

    prepare: Callable[[dict[str, np.ndarray]], Call]
    close: Callable[[], None] = lambda: None
    threads: int | None = None
    backend: str | None = None
    flop_module: Any = None  # a torch module FlopCounterMode can count
    source: str | None = None  # where the eager module came from


AA_SUFFIX = " (A/A)"  # the twin of an ONNX Runtime session: same spec, another process


def is_yardstick(spec: CandidateSpec) -> bool:
    """Whether the bench's ratios count `spec` as ONNX Runtime (their yardstick): a plain session on model.onnx, or an
    rlopt backend whose library is ONNX Runtime."""
    from rlopt.backends import BACKENDS
    from rlopt.onnx_session import LIBRARY

    backend = BACKENDS.get(spec.backend or "")
    return spec.kind == "onnx session" or (spec.kind == "rlopt" and backend is not None and backend.module == LIBRARY)


def candidate_specs(model_dir: Path, manifest: Manifest, network: str, recipe: Path | None, torch_compile: bool,
                    cores: int, skipped: list[Skip], protocol: bool = False) -> list[CandidateSpec]:
    """Every candidate for `network`; those the manifest already rules out go to `skipped` with the reason.

    `protocol`: only the candidates the protocol's ratios read (see the module docstring)."""
    record = manifest.networks[network]
    common = {"model_dir": str(model_dir), "network": network, "recipe": str(recipe) if recipe else None}
    specs = []
    for backend, artifact in ({} if protocol else record.artifacts).items():
        label = f"rlopt {backend}"
        if artifact.skipped:
            skipped.append(Skip(candidate=label, reason=artifact.skipped))
            continue
        if not artifact.verified:
            skipped.append(Skip(candidate=label, reason="failed verification at compile time"))
            continue
        reason = unavailable_reason(backend, artifact.facts)
        if reason is not None:
            skipped.append(Skip(candidate=label, reason=reason))
            continue
        selected = " (selected by auto)" if backend == record.selected else ""
        specs.append(CandidateSpec(label, "rlopt", f"rlopt.load(..., backend='{backend}').run{selected}", "rlopt",
                                   backend=backend, **common))
    specs.append(CandidateSpec("rlopt auto", "rlopt", "rlopt.load(..., backend='auto').run", "rlopt",
                               backend="auto", **common))
    if manifest_sb3(model_dir, manifest) is None:
        specs.append(CandidateSpec("pytorch eager", "baseline", "the nn.Module from the recipe", "eager", **common))
    elif network == "actor":
        specs.append(CandidateSpec("sb3 predict", "baseline", "SB3's model.predict(obs, deterministic=True)", "sb3",
                                   **common))
    else:
        skipped.append(Skip(candidate="pytorch eager", reason="an SB3 agent's network: its actor is benched against "
                                                              "'sb3 predict'"))
    if not protocol:
        specs += _torch_baselines(record, torch_compile, common, skipped)
    if "model.onnx" not in record.files:
        skipped.append(Skip(candidate="onnxruntime sessions", reason="manifest.json lists no model.onnx"))
        return specs
    for threads in sorted({1, cores}):
        label = f"onnxruntime {threads} thread" + ("s" if threads > 1 else "")
        note = f"model.onnx, ORT_ENABLE_ALL, intra_op_num_threads={threads}"
        specs.append(CandidateSpec(label, "baseline", note, "onnx session", threads=threads, **common))
        if protocol:
            specs.append(CandidateSpec(label + AA_SUFFIX, "baseline", note + ", another process", "onnx session",
                                       threads=threads, **common))
    return specs


def _torch_baselines(record: NetworkRecord, torch_compile: bool, common: dict[str, Any],
                     skipped: list[Skip]) -> list[CandidateSpec]:
    specs = []
    if "model.ts" in record.files:
        specs.append(CandidateSpec("torchscript module", "baseline", "torch.jit.load(model.ts), torch tensors",
                                   "torchscript module", **common))
    else:
        skipped.append(Skip(candidate="torchscript module", reason="manifest.json lists no model.ts"))
    if torch_compile:
        specs.append(CandidateSpec("torch.compile", "baseline", "torch.compile(eager) (inductor, default mode)",
                                   "torch.compile", **common))
    else:
        skipped.append(Skip(candidate="torch.compile", reason="not requested"))
    return specs


def manifest_sb3(model_dir: Path, manifest: Manifest) -> Path | None:
    """The agent zip a MODEL_DIR was compiled from (its recipe's `model.sb3`), None for a factory model."""
    from rlopt.recipe import load_recipe

    stored_path = checked_file(model_dir, manifest.recipe)
    sb3 = load_recipe(stored_path).model.sb3
    return None if sb3 is None else (stored_path.parent / sb3).resolve()


def check_recipe(model_dir: Path, manifest: Manifest, recipe: Path) -> None:
    """--recipe must be the recipe MODEL_DIR was compiled from: same `model` section (factory, kwargs, weights)."""
    from rlopt.recipe import load_recipe

    if not recipe.is_file():
        raise UsageError(located(recipe, "--recipe", "recipe not found", "give the recipe passed to 'rlopt compile'"))
    stored_path = checked_file(model_dir, manifest.recipe)
    if load_recipe(recipe).model != load_recipe(stored_path).model:
        raise UsageError(located(recipe, "model", f"differs from the model MODEL_DIR was compiled from "
                                 f"({stored_path})", "pass the recipe given to 'rlopt compile'"))


def _torch_call(module: Any, input_names: list[str]) -> Callable[[dict[str, np.ndarray]], Call]:
    torch = require("torch")

    def prepare(feeds: dict[str, np.ndarray]) -> Call:
        tensors = [torch.from_numpy(feeds[name]) for name in input_names]

        def call() -> object:
            with torch.inference_mode():
                return module(*tensors)

        return call

    return prepare


def eager_module(model_dir: Path, manifest: Manifest, network: str, recipe: Path | None) -> tuple[Any, str]:
    """The eager PyTorch network and where it came from; raises BackendUnavailable with the reason when it cannot."""
    from rlopt.recipe import load_recipe
    from rlopt.user_model import build_model, submodule

    stored_path = checked_file(model_dir, manifest.recipe)
    stored = load_recipe(stored_path)
    if recipe is not None:
        check_recipe(model_dir, manifest, recipe)
        source_path, source = Path(recipe), f"recipe {recipe}"
    else:
        target = stored.model.factory.rpartition(":")[0]
        if target.endswith(".py") or "/" in target or stored.model.checkpoint:
            raise BackendUnavailable(
                f"needs the model code: the factory '{stored.model.factory}'"
                + (" and checkpoint are" if stored.model.checkpoint else " is")
                + " relative to the original recipe; pass --recipe RECIPE")
        source_path, source = stored_path, f"importable factory {stored.model.factory}"
    try:
        model, _ = build_model(stored.model, source_path)
    except RloptError as exc:
        raise BackendUnavailable(f"cannot rebuild the model from {source}: {exc}") from None
    module = submodule(model, manifest.networks[network].module, source_path, network)
    return module, source


def _check_eager(module: Any, record: NetworkRecord, reference: Reference) -> None:
    """The rebuilt module must reproduce the recorded outputs, or it is not the model that was compiled."""
    from rlopt.verify import check_parity, tolerance_of

    torch = require("torch")
    names = list(record.inputs)

    def infer(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        with torch.inference_mode():
            result = module(*[torch.from_numpy(feeds[n]) for n in names])
        flat = list(result) if isinstance(result, (tuple, list)) else [result]
        return [t.detach().numpy() for t in flat]

    parity = check_parity(infer, reference, record.kind, record.distribution, tolerance_of(record))
    if not parity.passed:
        raise BackendUnavailable(f"the rebuilt model does not reproduce reference.npz (max_abs {parity.max_abs:.2e}): "
                                 "its code or weights changed since compile")


def _checked_eager(spec: CandidateSpec) -> tuple[Any, str, list[str]]:
    """The eager module, checked against reference.npz, its source and input names (for eager and torch.compile)."""
    model_dir = Path(spec.model_dir)
    manifest = read_manifest(model_dir)
    record = manifest.networks[spec.network]
    module, source = eager_module(model_dir, manifest, spec.network, Path(spec.recipe) if spec.recipe else None)
    _check_eager(module, record, load_reference(model_dir, record))
    return module, source, list(record.inputs)


def _open_eager(spec: CandidateSpec) -> OpenCandidate:
    module, source, names = _checked_eager(spec)
    return OpenCandidate(_torch_call(module, names), threads=require("torch").get_num_threads(), flop_module=module,
                         source=source)


def _open_torch_compile(spec: CandidateSpec) -> OpenCandidate:
    torch = require("torch")
    try:
        module, source, names = _checked_eager(spec)
    except BackendUnavailable as exc:
        raise BackendUnavailable(f"needs the eager model (see pytorch eager): {exc}") from None
    compiled = torch.compile(module)
    return OpenCandidate(_torch_call(compiled, names), lambda: torch._dynamo.reset(), torch.get_num_threads(),
                         source=source)


def _open_torchscript(spec: CandidateSpec) -> OpenCandidate:
    torch = require("torch")
    model_dir = Path(spec.model_dir)
    record = read_manifest(model_dir).networks[spec.network]
    scripted = torch.jit.load(str(checked_file(model_dir, record.files["model.ts"])), map_location="cpu").eval()
    return OpenCandidate(_torch_call(scripted, list(record.inputs)), threads=torch.get_num_threads(),
                         flop_module=scripted)


def _open_onnx_session(spec: CandidateSpec) -> OpenCandidate:
    """The exported model.onnx in a plain ONNX Runtime session (ORT_ENABLE_ALL, CPU, `spec.threads` intra-op)."""
    from rlopt.onnx_session import make_session

    model_dir = Path(spec.model_dir)
    record = read_manifest(model_dir).networks[spec.network]
    session = make_session(checked_file(model_dir, record.files["model.onnx"]), threads=int(spec.threads or 1))

    def prepare(feeds: dict[str, np.ndarray]) -> Call:
        return lambda: session.run(None, feeds)

    return OpenCandidate(prepare, threads=spec.threads)


def _open_rlopt(spec: CandidateSpec) -> OpenCandidate:
    import rlopt

    try:
        session = rlopt.load(spec.model_dir, spec.network, spec.backend or "auto")
    except (ArtifactError, BackendUnavailable) as exc:  # one broken backend must not hide the others' figures
        raise BackendUnavailable(f"cannot be loaded: {exc}") from None
    backend = str(getattr(session, "backend", spec.backend))
    return OpenCandidate(lambda feeds: (lambda: session.run(feeds)), session.close,
                         _backend_threads(Path(spec.model_dir), spec.network, backend), backend)


def _backend_threads(model_dir: Path, network: str, backend: str) -> int | None:
    """The threads an rlopt backend computes with (`Backend.threads`), where it is a number (None: not known)."""
    from rlopt.backends import BACKENDS, facts_of

    artifact = read_manifest(model_dir).networks[network].artifacts.get(backend)
    if backend not in BACKENDS or artifact is None:
        return None
    threads = BACKENDS[backend].threads(facts_of(backend, artifact.facts))
    return threads if isinstance(threads, int) else None


def _open_sb3(spec: CandidateSpec) -> OpenCandidate:
    """SB3's own `predict` on the zip the MODEL_DIR was compiled from (plain observations: no state, no masks)."""
    from rlopt.sb3.agent import load_agent

    model_dir = Path(spec.model_dir)
    manifest = read_manifest(model_dir)
    zip_path = manifest_sb3(model_dir, manifest)
    if zip_path is None or not zip_path.is_file():
        raise BackendUnavailable(f"the agent zip {zip_path} the MODEL_DIR was compiled from is not there")
    agent = load_agent(zip_path)
    record = manifest.networks[spec.network]
    extra = [name for name in record.inputs if name not in {obs.name for obs in agent.inputs}]
    if extra:
        raise BackendUnavailable(f"benches plain observations only; this actor also takes {extra}")
    keys = {obs.name: obs.key for obs in agent.inputs}

    def prepare(feeds: dict[str, np.ndarray]) -> Call:
        obs: Any = ({keys[name]: value for name, value in feeds.items()} if any(keys.values())
                    else next(iter(feeds.values())))
        return lambda: agent.model.predict(obs, deterministic=True)

    return OpenCandidate(prepare, threads=require("torch").get_num_threads(), source=f"agent zip {zip_path}")


def _open_factory(spec: CandidateSpec) -> OpenCandidate:
    module_name, _, function = (spec.factory or "").partition(":")
    opened = getattr(importlib.import_module(module_name), function)(spec)
    if not isinstance(opened, OpenCandidate):
        raise TypeError(f"{spec.factory} returned {type(opened).__name__}, not an OpenCandidate")
    return opened


OPENERS: dict[CandidateKind, Callable[[CandidateSpec], OpenCandidate]] = {
    "rlopt": _open_rlopt, "eager": _open_eager, "torch.compile": _open_torch_compile,
    "torchscript module": _open_torchscript, "onnx session": _open_onnx_session, "sb3": _open_sb3,
    "factory": _open_factory}


def load_reference(model_dir: Path, record: NetworkRecord) -> Reference:
    return Reference.load(checked_file(model_dir, record.reference), list(record.inputs), record.outputs)


def count_gflop(module: Any, input_names: list[str], feeds: dict[str, np.ndarray]) -> float | None:
    """FLOPs of one call (torch's FlopCounterMode: matmul / conv families), in GFLOP; None when it cannot tell."""
    torch = require("torch")
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False) as counter, torch.inference_mode():
            module(*[torch.from_numpy(feeds[n]) for n in input_names])
    except Exception:  # noqa: BLE001 -- counting is a nicety; any failure just means "unknown"
        return None
    total = counter.get_total_flops()
    return total / 1e9 if total else None

__all__ = [
    "AA_SUFFIX",
    "CandidateKind",
    "OPENERS",
    "Call",
    "CandidateSpec",
    "OpenCandidate",
    "candidate_specs",
    "check_recipe",
    "count_gflop",
    "eager_module",
    "is_yardstick",
    "load_reference",
    "manifest_sb3",
]
