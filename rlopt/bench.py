"""`rlopt bench`: every built backend next to the baselines a user would otherwise pick, per profile shape.

Candidates, per network:
- each backend built, verified and runnable here, through `rlopt.load` (numpy in, numpy out: what
  users call);
- PyTorch eager: the model rebuilt from the recipe. A MODEL_DIR does not hold model code, and a
  recipe's file factory is relative to the ORIGINAL recipe, so eager needs `--recipe` (the one
  given to `rlopt compile`); its `model` section must equal MODEL_DIR/recipe.yaml's and the
  rebuilt module must reproduce reference.npz, else eager is skipped with the reason. A factory
  given as an importable module (`pkg.module:callable`) needs no `--recipe`;
- the TorchScript module (model.ts) called directly with torch tensors;
- `torch.compile` of the eager module (inductor; its compile time is reported, not timed);
- ONNX Runtime on the exported model.onnx with ORT_ENABLE_ALL at 1 intra-op thread and at all
  usable cores.
Torch candidates get torch tensors made once per shape (`torch.from_numpy`, no copy), ONNX Runtime
candidates numpy arrays: each is called the way its users call it.

Timing is interleaved round by round (a short block of calls of every candidate per round, the
order rotated each round) so machine drift hits all alike; each candidate gets WARMUP_CALLS
untimed calls first, and each block's first call is untimed (see `time_interleaved`).
Reported: median and p99 of single calls, and median / (best ONNX Runtime median).
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
from pydantic import BaseModel

from rlopt.errors import ArtifactError, BackendUnavailable, RloptError, UsageError, describe_exception, located
from rlopt.lazy import require
from rlopt.machine import machine_facts
from rlopt.manifest import Manifest, NetworkRecord, checked_file, read_manifest
from rlopt.reference import Reference
from rlopt.runtime.backends import unavailable_reason

WARMUP_CALLS = 5
BLOCK_CALLS = 3
MIN_ROUNDS = 10
MAX_ROUNDS = 2000
DEFAULT_BUDGET_S = 2.0

Call = Callable[[], object]


class CandidateResult(BaseModel):
    candidate: str
    group: str
    median_us: float
    p99_us: float
    mean_us: float
    calls: int
    ratio_to_ort_best: float | None
    gflops_per_s: float | None
    first_call_ms: float


class ShapeBench(BaseModel):
    point: str
    shape: dict[str, list[int]]
    gflop: float | None
    rounds: int
    ort_best: str | None
    results: list[CandidateResult]


class Skip(BaseModel):
    candidate: str
    reason: str


class NetworkBench(BaseModel):
    network: str
    eager_source: str | None
    candidates: dict[str, str]
    skipped: list[Skip]
    shapes: list[ShapeBench]


class BenchReport(BaseModel):
    kind: str = "rlopt-bench"
    schema_version: int = 1
    created_at: str
    model_dir: str
    budget_s: float
    method: str
    machine: dict[str, Any]
    versions: dict[str, str | None]
    networks: list[NetworkBench]
    warnings: list[str] = []


METHOD = (f"interleaved rounds: per round each candidate runs a block of {BLOCK_CALLS} back-to-back calls, the "
          "first untimed (it absorbs the previous candidate's spinning thread pools), order rotated each round; "
          f"{WARMUP_CALLS} untimed warmup calls per candidate and shape first; median and p99 of single calls; "
          "ratio = median / best ONNX Runtime median at that shape")


@dataclass
class Candidate:
    """Something to time: `prepare(feeds)` returns a zero-argument call bound to those inputs."""

    name: str
    group: str
    note: str
    prepare: Callable[[dict[str, np.ndarray]], Call]
    close: Callable[[], None] = lambda: None
    facts: dict[str, Any] = field(default_factory=dict)


def usable_cores() -> int:
    """Cores this thread may run on (not os.cpu_count(): a container or a pinned thread has fewer)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


# ----------------------------------------------------------------------------------------------------------------
# Candidates


def _rlopt_candidates(model_dir: Path, network: str, record: NetworkRecord, skipped: list[Skip]) -> list[Candidate]:
    import rlopt

    candidates = []
    for backend, artifact in record.artifacts.items():
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
        try:
            session = rlopt.load(model_dir, network, backend)
        except (ArtifactError, BackendUnavailable) as exc:  # one broken backend must not hide the others' figures
            skipped.append(Skip(candidate=label, reason=f"cannot be loaded: {exc}"))
            continue
        selected = " (selected by auto)" if backend == record.selected else ""
        candidates.append(Candidate(label, "rlopt", f"rlopt.load(..., backend='{backend}').run{selected}",
                                    lambda feeds, s=session: (lambda: s.run(feeds)), session.close))
    return candidates


def _torch_call(module: Any, input_names: list[str]) -> Callable[[dict[str, np.ndarray]], Call]:
    torch = require("torch")

    def prepare(feeds: dict[str, np.ndarray]) -> Call:
        tensors = [torch.from_numpy(feeds[name]) for name in input_names]

        def call() -> object:
            with torch.inference_mode():
                return module(*tensors)

        return call

    return prepare


def check_recipe(model_dir: Path, manifest: Manifest, recipe: Path) -> None:
    """--recipe must be the recipe MODEL_DIR was compiled from: same `model` section (factory, kwargs, weights)."""
    from rlopt.recipe import load_recipe

    if not recipe.is_file():
        raise UsageError(located(recipe, "--recipe", "recipe not found", "give the recipe passed to 'rlopt compile'"))
    stored_path = checked_file(model_dir, manifest.recipe)
    if load_recipe(recipe).model != load_recipe(stored_path).model:
        raise UsageError(located(recipe, "model", f"differs from the model MODEL_DIR was compiled from "
                                 f"({stored_path})", "pass the recipe given to 'rlopt compile'"))


def eager_module(model_dir: Path, manifest: Manifest, network: str, recipe: Path | None) -> tuple[Any, str]:
    """The eager PyTorch network and where it came from; raises BackendUnavailable with the reason when it cannot."""
    from rlopt.recipe import load_recipe
    from rlopt.stages.load_model import build_model, submodule

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


def _torch_candidates(model_dir: Path, manifest: Manifest, network: str, recipe: Path | None,
                      reference: Reference, skipped: list[Skip], torch_compile: bool
                      ) -> tuple[list[Candidate], str | None, Any]:
    """PyTorch eager, the TorchScript module, torch.compile; also returns a module for FLOP counting."""
    torch = require("torch")
    record = manifest.networks[network]
    names = list(record.inputs)
    candidates: list[Candidate] = []
    eager, source = None, None
    try:
        eager, source = eager_module(model_dir, manifest, network, recipe)
        _check_eager(eager, record, reference)
        candidates.append(Candidate("pytorch eager", "baseline", f"the nn.Module from {source}",
                                    _torch_call(eager, names)))
    except BackendUnavailable as exc:
        eager, source = None, None
        skipped.append(Skip(candidate="pytorch eager", reason=str(exc)))
    scripted = None
    if "model.ts" in record.files:
        scripted = torch.jit.load(str(checked_file(model_dir, record.files["model.ts"])), map_location="cpu").eval()
        candidates.append(Candidate("torchscript module", "baseline", "torch.jit.load(model.ts), torch tensors",
                                    _torch_call(scripted, names)))
    else:
        skipped.append(Skip(candidate="torchscript module", reason="manifest.json lists no model.ts"))
    if eager is None:
        skipped.append(Skip(candidate="torch.compile", reason="needs the eager model (see pytorch eager)"))
    elif not torch_compile:
        skipped.append(Skip(candidate="torch.compile", reason="not requested"))
    else:
        candidates.append(_torch_compile_candidate(eager, names))
    return candidates, source, eager if eager is not None else scripted


def _torch_compile_candidate(eager: Any, names: list[str]) -> Candidate:
    torch = require("torch")
    compiled = torch.compile(eager)
    candidate = Candidate("torch.compile", "baseline", "torch.compile(eager) (inductor, default mode)",
                          _torch_call(compiled, names), lambda: torch._dynamo.reset())
    return candidate


def _ort_candidates(model_dir: Path, record: NetworkRecord, cores: int, skipped: list[Skip]) -> list[Candidate]:
    if "model.onnx" not in record.files:
        skipped.append(Skip(candidate="onnxruntime", reason="manifest.json lists no model.onnx"))
        return []
    ort = require("onnxruntime")
    path = str(checked_file(model_dir, record.files["model.onnx"]))
    candidates = []
    for threads in sorted({1, cores}):
        options = ort.SessionOptions()
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        session = ort.InferenceSession(path, sess_options=options, providers=["CPUExecutionProvider"])

        def prepare(feeds: dict[str, np.ndarray], s: Any = session) -> Call:
            return lambda: s.run(None, feeds)

        label = f"onnxruntime {threads} thread" + ("s" if threads > 1 else "")
        candidates.append(Candidate(label, "baseline", f"model.onnx, ORT_ENABLE_ALL, intra_op_num_threads={threads}",
                                    prepare))
    return candidates


# ----------------------------------------------------------------------------------------------------------------
# Timing


def count_gflop(module: Any, record: NetworkRecord, feeds: dict[str, np.ndarray]) -> float | None:
    """FLOPs of one call (torch's FlopCounterMode: matmul / conv families), in GFLOP; None when it cannot tell."""
    torch = require("torch")
    from torch.utils.flop_counter import FlopCounterMode

    try:
        with FlopCounterMode(display=False) as counter, torch.inference_mode():
            module(*[torch.from_numpy(feeds[n]) for n in record.inputs])
    except Exception:  # counting is a nicety; any failure just means "unknown"
        return None
    total = counter.get_total_flops()
    return total / 1e9 if total else None


def time_interleaved(calls: dict[str, Call], budget_s: float, min_rounds: int = MIN_ROUNDS,
                     max_rounds: int = MAX_ROUNDS) -> tuple[dict[str, np.ndarray], dict[str, float], dict[str, str]]:
    """Warm every call, then rounds of one short block per candidate (order rotated each round); samples in ns.

    A block is BLOCK_CALLS back-to-back calls of one candidate; its first call is not timed: it absorbs the
    previous candidate's thread pools still spinning (ONNX Runtime, OpenMP and TVM workers spin after a call;
    on a 2-core machine that made the next PyTorch call 35 ms instead of 0.2 ms). Returns samples, first-call ms,
    and failures (a candidate that raises is dropped with its reason).
    """
    first_ms: dict[str, float] = {}
    failures: dict[str, str] = {}
    estimate = 0.0
    live: dict[str, Call] = {}
    for name, call in calls.items():
        try:
            start = time.perf_counter()
            call()
            first_ms[name] = (time.perf_counter() - start) * 1e3
            for _ in range(WARMUP_CALLS - 1):
                start = time.perf_counter()
                call()
            estimate += (time.perf_counter() - start) * BLOCK_CALLS
            live[name] = call
        except Exception as exc:  # a baseline may fail here (e.g. torch.compile without a compiler)
            failures[name] = describe_exception(exc)
    rounds = int(min(max_rounds, max(min_rounds, budget_s / max(estimate, 1e-7))))
    timed = BLOCK_CALLS - 1
    names = list(live)
    samples = {name: np.empty(rounds * timed, dtype=np.int64) for name in names}
    clock = time.perf_counter_ns
    # the estimate comes from a few calls; a busy machine can make rounds much slower: stop at twice the budget
    give_up = clock() + int(2 * budget_s * 1e9)
    done = 0
    for r in range(rounds):
        offset = r % len(names) if names else 0
        for name in names[offset:] + names[:offset]:
            call, out = live[name], samples[name]
            call()
            for k in range(r * timed, (r + 1) * timed):
                start = clock()
                call()
                out[k] = clock() - start
        done = r + 1
        if done >= min_rounds and clock() > give_up:
            break
    return {name: s[:done * timed] for name, s in samples.items()}, first_ms, failures


def _profile_points(record: NetworkRecord, reference: Reference) -> list[str]:
    return [p for p in reference.points if reference.samples(p) > 0]


def bench_network(model_dir: Path, manifest: Manifest, network: str, recipe: Path | None, budget_s: float,
                  progress: Callable[[str], None], torch_compile: bool = True, cores: int = 0) -> NetworkBench:
    record = manifest.network(network, model_dir)
    reference = Reference.load(checked_file(model_dir, record.reference), list(record.inputs), record.outputs)
    skipped: list[Skip] = []
    progress(f"{network}: opening candidates")
    candidates = _rlopt_candidates(model_dir, network, record, skipped)
    torch_candidates, eager_source, flop_module = _torch_candidates(model_dir, manifest, network, recipe, reference,
                                                                    skipped, torch_compile)
    candidates += torch_candidates + _ort_candidates(model_dir, record, cores or usable_cores(), skipped)
    shapes: list[ShapeBench] = []
    try:
        for point in _profile_points(record, reference):
            feeds = reference.feeds(point, 0)
            shape = reference.shape(point)
            progress(f"{network}: {point} {shape}: {len(candidates)} candidates, ~{budget_s:g} s")
            calls = {c.name: c.prepare(feeds) for c in candidates}
            samples, first_ms, failures = time_interleaved(calls, budget_s)
            for c in [c for c in candidates if c.name in failures]:
                skipped.append(Skip(candidate=c.name, reason=f"failed at {point} {shape}: {failures[c.name]}"))
                c.close()
            candidates = [c for c in candidates if c.name not in failures]
            gflop = count_gflop(flop_module, record, feeds) if flop_module is not None else None
            medians = {n: float(np.median(s)) / 1e3 for n, s in samples.items() if s.size}
            ort = {n: m for n, m in medians.items() if "onnxruntime" in n}
            ort_best = min(ort, key=ort.__getitem__) if ort else None
            results = []
            for c in candidates:
                s = samples.get(c.name)
                if s is None or not s.size:
                    continue
                us = s / 1e3
                median = medians[c.name]
                results.append(CandidateResult(
                    candidate=c.name, group=c.group, median_us=round(median, 2),
                    p99_us=round(float(np.percentile(us, 99)), 2), mean_us=round(float(us.mean()), 2),
                    calls=int(s.size),
                    ratio_to_ort_best=round(median / ort[ort_best], 3) if ort_best else None,
                    gflops_per_s=round(gflop / (median * 1e-6), 2) if gflop else None,
                    first_call_ms=round(first_ms[c.name], 3)))
            results.sort(key=lambda r: r.median_us)
            rounds = min(s.size for s in samples.values()) // (BLOCK_CALLS - 1) if samples else 0
            shapes.append(ShapeBench(point=point, shape=shape, gflop=gflop, rounds=rounds, ort_best=ort_best,
                                     results=results))
    finally:
        for c in candidates:
            c.close()
    return NetworkBench(network=network, eager_source=eager_source,
                        candidates={c.name: c.note for c in candidates}, skipped=skipped, shapes=shapes)


def run_bench(model_dir: Path | str, network: str | None = None, recipe: Path | str | None = None, *,
              budget_s: float = DEFAULT_BUDGET_S, progress: Callable[[str], None] | None = None,
              torch_compile: bool = True) -> BenchReport:
    """Bench one network (or all) of a MODEL_DIR; see the module docstring for what is compared and how.

    `torch_compile=False` leaves torch.compile out (its first compile takes many seconds); tests use it.
    """
    from rlopt.pipeline import tool_versions

    model_dir = Path(model_dir)
    manifest = read_manifest(model_dir)
    if network is not None:
        manifest.network(network, model_dir)
    if recipe is not None:
        check_recipe(model_dir, manifest, Path(recipe))
    if not budget_s > 0:
        raise UsageError(f"--budget {budget_s}: must be > 0 seconds per shape; fix: e.g. --budget 2")
    # TVM's thread pool pins the thread that configures it to one core unless TVM_BIND_THREADS=0; in a harness
    # that runs every candidate on one thread, that would leave the candidates after TVM on a single core.
    os.environ.setdefault("TVM_BIND_THREADS", "0")
    torch = require("torch")
    affinity = _affinity()
    load_start = _load_average()
    names = [network] if network else list(manifest.networks)
    results = [bench_network(model_dir, manifest, name, Path(recipe) if recipe else None, budget_s,
                             progress or (lambda _: None), torch_compile, len(affinity)) for name in names]
    warnings = []
    if _affinity() != affinity:
        warnings.append(f"this thread's CPU affinity changed during the run, from cores {sorted(affinity)} to "
                        f"{sorted(_affinity())}: a runtime pinned it (TVM does so when its thread pool is "
                        "configured unless TVM_BIND_THREADS=0), so later candidates ran on fewer cores")
    threads = {"usable_cores": len(affinity), "torch_threads": torch.get_num_threads()}
    machine = machine_facts() | {"threads": threads, "load_average_start": load_start,
                                 "load_average_end": _load_average()}
    return BenchReport(created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), model_dir=str(model_dir),
                       budget_s=budget_s, method=METHOD, machine=machine, versions=tool_versions(), networks=results,
                       warnings=warnings)


def _load_average() -> list[float] | None:
    """1/5/15-minute load averages: a bench on a busy machine says so."""
    return [round(v, 2) for v in os.getloadavg()] if hasattr(os, "getloadavg") else None


def _affinity() -> set[int]:
    return set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))


# ----------------------------------------------------------------------------------------------------------------
# Rendering


def _us(value: float) -> str:
    return f"{value / 1000:.2f} ms" if value >= 1000 else f"{value:.1f} us"


def bench_tables(report: BenchReport) -> list[Any]:
    """One rich table per network: shape x candidate, fastest first."""
    from rich.markup import escape
    from rich.table import Table

    tables = []
    for net in report.networks:
        table = Table(title=f"{net.network}: median / p99 per call, x = median / best ONNX Runtime median")
        for column in ("shape", "candidate", "median", "p99", "x ORT best", "GFLOP/s", "first call"):
            table.add_column(column, justify="right", overflow="fold")
        for shape in net.shapes:
            label = f"{shape.point} " + " ".join("x".join(map(str, d)) for d in shape.shape.values())
            for i, r in enumerate(shape.results):
                ratio = "-" if r.ratio_to_ort_best is None else f"{r.ratio_to_ort_best:.2f}"
                style = "bold green" if i == 0 else ""
                table.add_row(label if i == 0 else "", f"[{style}]{r.candidate}[/]" if style else r.candidate,
                              _us(r.median_us), _us(r.p99_us), ratio,
                              "-" if r.gflops_per_s is None else f"{r.gflops_per_s:.1f}", f"{r.first_call_ms:.1f} ms")
            table.add_section()
        rounds = sorted({shape.rounds for shape in net.shapes})
        notes = [f"{skip.candidate}: {skip.reason}" for skip in net.skipped]
        table.caption = escape(f"{'/'.join(map(str, rounds)) or 0} interleaved rounds per shape; "
                               + ("not run: " + "; ".join(notes) if notes else "every candidate ran"))
        tables.append(table)
    if tables and report.warnings:
        tables[-1].caption += escape("; WARNING: " + "; ".join(report.warnings))
    return tables


__all__ = ["run_bench", "BenchReport", "bench_tables", "time_interleaved"]
