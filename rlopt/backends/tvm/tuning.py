"""MetaSchedule tuning with a database users commit: `<recipe>.tuning/<target key>/` next to the recipe.

Why it is shaped like this (shared notes, measured here):
- Untuned TVM is 10-100x slower than ONNX Runtime on CPU; tuned, it is faster. Tuning a
  symbolic-shape module fails, and a static database does not apply to the dynamic module, so
  every network is tuned as one static-shape workload per profile shape (min, opt, max).
- Tasks come only from fused TIR, so workloads are imported exactly as the build imports them
  (rlopt.backends.tvm.importer), and a record found at tuning time is found again at compile time.
- MetaSchedule records carry no usable target check, so the database folder is keyed by
  target kind and mcpu: a database tuned for one CPU is never applied to another.
- Every tuning call pays 20-40 s of set-up (worker processes), so all workloads of a recipe
  are tuned in one call, identical kernels once.
- Resume: a kernel that already has `trials` records is not tuned again; one with fewer
  continues from its best records (the evolutionary search seeds from the database).
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from rlopt.errors import StageError, UsageError, located
from rlopt.lazy import require
from rlopt.recipe import NetworkSpec, Recipe, load_recipe

TUNING_SUFFIX = ".tuning"
META_NAME = "meta.json"
WORKLOAD_FILE = "database_workload.json"
RECORD_FILE = "database_tuning_record.json"
TUNING_EXTRAS = "pip install 'rlopt[tune]' (psutil, cloudpickle, tornado, xgboost-cpu)"
Shapes = dict[str, list[int]]


# ---------------------------------------------------------------- targets and keys

def host_cpu() -> str:
    """LLVM's name for this CPU (e.g. znver4), as TVM's own LLVM sees it."""
    codegen = require("tvm.target.codegen")
    return str(codegen.llvm_get_system_cpu())


def host_cores() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


def resolve_target(config_target: dict[str, Any]) -> dict[str, Any]:
    """The recipe's target completed for this host: llvm gets mcpu (detected) and num-cores.

    Keys the recipe gives win, so a fleet's CPU can be named explicitly ({kind: llvm, mcpu: skylake-avx512}).
    """
    target = dict(config_target)
    if target.get("kind") == "llvm":
        target.setdefault("mcpu", host_cpu())
        target.setdefault("num-cores", host_cores())
    return target


def target_key(target: dict[str, Any]) -> str:
    """The database folder for a target: what picks the code (kind, mcpu or arch), not the core count."""
    import re

    parts = [str(target.get("kind", "llvm"))] + [str(target[k]) for k in ("mcpu", "arch") if target.get(k)]
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", "-".join(parts))


def tuning_root(recipe_path: Path) -> Path:
    """`recipes/ppo_mlp.yaml` -> `recipes/ppo_mlp.tuning/` (committed next to the recipe)."""
    return recipe_path.with_name(recipe_path.stem + TUNING_SUFFIX)


def database_dir(recipe_path: Path, target: dict[str, Any]) -> Path:
    return tuning_root(recipe_path) / target_key(target)


def shape_key(shapes: Shapes) -> str:
    """`input0=1x1x768` (inputs in order, joined by ','): names a workload and a shape-bucket file."""
    return ",".join(f"{name}={'x'.join(str(d) for d in dims)}" for name, dims in shapes.items())


def file_slug(shapes: Shapes) -> str:
    """`1x1x768` for one input, `1x17_4x3` for several: safe in a file name."""
    return "_".join("x".join(str(d) for d in dims) for dims in shapes.values())


def profile_shapes(spec: NetworkSpec) -> list[tuple[list[str], Shapes]]:
    """Distinct static shapes of a network (min/opt/max, then its extra shapes), each with the points it serves."""
    from rlopt.recipe import PROFILE_POINTS

    found: dict[tuple, tuple[list[str], Shapes]] = {}
    named = [(point, {name: s.dims(point) for name, s in spec.inputs.items()}) for point in PROFILE_POINTS]
    for point, shapes in [*named, *spec.points().items()]:
        key = tuple(tuple(v) for v in shapes.values())
        points = found.setdefault(key, ([], shapes))[0]
        if point not in points:
            points.append(point)
    return list(found.values())


# ---------------------------------------------------------------- the database

_OPENED: dict[tuple[str, int, int], Any] = {}


def open_database(directory: Path, *, create: bool) -> Any | None:
    """The JSON database in `directory`, or None when there is none (and `create` is False).

    Parsing a shipped database takes ~1 s; compile opens it once per process while its files are unchanged.
    """
    ms = require("tvm.s_tir.meta_schedule")
    exists = (directory / WORKLOAD_FILE).is_file() and (directory / RECORD_FILE).is_file()
    if not exists and not create:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    if not create:
        key = (str(directory.resolve()), (directory / WORKLOAD_FILE).stat().st_mtime_ns,
               (directory / RECORD_FILE).stat().st_mtime_ns)
        if key in _OPENED:
            return _OPENED[key]
    try:
        database = ms.database.JSONDatabase(work_dir=str(directory), allow_missing=True)
        if not create:
            _OPENED[key] = database
        return database
    except Exception as exc:  # TVM raises ValueError/TVMError for unreadable or malformed records
        raise StageError(located(directory, WORKLOAD_FILE, f"not a readable MetaSchedule database "
                                 f"({str(exc).strip().splitlines()[-1]})",
                                 "delete the folder and run 'rlopt tune RECIPE' again")) from None


def read_meta(directory: Path) -> dict[str, Any]:
    path = directory / META_NAME
    if not path.is_file():
        return {}
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return document if isinstance(document, dict) else {}


def write_meta(directory: Path, target: dict[str, Any], cost_model: str, workloads: dict[str, Any]) -> None:
    from rlopt.lazy import version_of
    from rlopt.manifest import write_json

    meta = read_meta(directory)
    known = dict(meta.get("workloads", {}))
    known.update(workloads)
    write_json(directory / META_NAME, {
        "target": target, "apache-tvm": version_of("apache-tvm"), "cost_model": cost_model,
        "updated": datetime.now(timezone.utc).isoformat(timespec="seconds"), "workloads": known,
    })


def prune_records(directory: Path) -> tuple[int, int]:
    """Keep each workload's fastest record (MetaSchedule's own pruning rule: lowest mean run time).

    Compile applies only the best record per kernel; a full history parses in ~1.5 s, a pruned one in
    ~0.05 s, and a committed database stays small. The workload file (which records index) is untouched
    and the record file is replaced atomically. Returns (records before, records after).
    """
    import math

    path = directory / RECORD_FILE
    best: dict[int, tuple[float, str]] = {}
    lines = [line for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    for line in lines:
        try:
            workload, record = json.loads(line)
            times = [float(t) for t in record[1]]
        except (ValueError, TypeError, IndexError):
            continue  # a malformed line: TVM itself refuses it when the database opens
        mean = sum(times) / len(times) if times else math.inf
        if not math.isfinite(mean) or mean <= 0 or mean >= 1e9:
            continue  # failed builds and runs are recorded with huge or missing times
        if workload not in best or mean < best[workload][0]:
            best[workload] = (mean, line)
    kept = [best[w][1] for w in sorted(best)]
    if len(kept) < len(lines):
        from rlopt.manifest import atomic_write_text

        atomic_write_text(path, "".join(line + "\n" for line in kept))
    return len(lines), len(kept)


def apply_database(mod: Any, target: Any, database: Any) -> Any:
    """Replace every fused kernel that has a record with its tuned schedule (under 0.1 s)."""
    relax = require("tvm.relax")
    with target, database:
        return relax.transform.MetaScheduleApplyDatabase(enable_warning=False)(mod)


# ---------------------------------------------------------------- workloads and tasks

@dataclass
class Workload:
    """One network at one static shape: the unit that is tuned and built."""

    network: str
    points: list[str]
    shapes: Shapes
    onnx_model: Any

    @property
    def key(self) -> str:
        return f"{self.network}[{shape_key(self.shapes)}]"


@dataclass
class Task:
    """One kernel to tune (identical kernels of several workloads are one task)."""

    name: str
    mod: Any
    extracted: Any
    workloads: list[str] = field(default_factory=list)
    flop: float = 0.0
    records: int = 0
    trials: int = 0
    done: int = 0
    best_us: float | None = None


def is_tunable(extracted: Any) -> bool:
    """Kernels with arithmetic (fused matmul/conv/...) are tuned; pure data movement is left to the default schedule."""
    analysis = require("tvm.s_tir.analysis")
    try:
        flop = float(analysis.estimate_tir_flops(extracted.dispatched[0]))
    except Exception:  # the estimator refuses some data-movement kernels: nothing to tune there
        return False
    return flop > 1


def extract_tasks(workloads: list[Workload], target: Any) -> list[Task]:
    """Fused kernels of every workload, deduplicated by structural equality."""
    ms = require("tvm.s_tir.meta_schedule")
    tvm_ffi = require("tvm_ffi")
    analysis = require("tvm.s_tir.analysis")
    from rlopt.backends.tvm.importer import import_relax

    tasks: list[Task] = []
    by_hash: dict[int, list[Task]] = {}
    for workload in workloads:
        mod, _ = import_relax(workload.onnx_model, target, workload.shapes)
        for extracted in ms.relax_integration.extract_tasks(mod, target):
            if not is_tunable(extracted):
                continue
            kernel = extracted.dispatched[0]
            digest = tvm_ffi.structural_hash(kernel)
            same = next((t for t in by_hash.get(digest, []) if tvm_ffi.structural_equal(t.mod, kernel)), None)
            if same is None:
                same = Task(name=f"{workload.network}/{file_slug(workload.shapes)}/{extracted.task_name}",
                            mod=kernel, extracted=extracted,
                            flop=float(analysis.estimate_tir_flops(kernel)))
                by_hash.setdefault(digest, []).append(same)
                tasks.append(same)
            if workload.key not in same.workloads:
                same.workloads.append(workload.key)
    return tasks


def count_records(database: Any, task: Task, limit: int) -> int:
    if not database.has_workload(task.mod):
        return 0
    return len(database.get_top_k(database.commit_workload(task.mod), limit))


# ---------------------------------------------------------------- progress and budget

class TuneReporter(Protocol):
    def tuning_started(self, tasks: list[Task], skipped: list[Task]) -> None: ...

    def trials_measured(self, task: Task) -> None: ...

    def tuning_finished(self, stopped_by_budget: bool) -> None: ...


class _SilentTuning:
    def tuning_started(self, tasks: list[Task], skipped: list[Task]) -> None:
        pass

    def trials_measured(self, task: Task) -> None:
        pass

    def tuning_finished(self, stopped_by_budget: bool) -> None:
        pass


class BudgetSpent(Exception):
    """Raised from the measure callback to end tuning when --time-budget is spent."""


def _progress_callback(tasks: list[Task], reporter: TuneReporter, deadline: float | None,
                       stopped: list[bool]) -> Any:
    """A MetaSchedule measure callback: updates trials/best latency, and ends every task once the budget is spent."""
    ms = require("tvm.s_tir.meta_schedule")
    from tvm.ir.utils import derived_object

    @derived_object
    class ProgressAndBudget(ms.measure_callback.PyMeasureCallback):
        def apply(self, task_scheduler: Any, task_id: int, measure_candidates: Any, builder_results: Any,
                  runner_results: Any) -> None:
            task = tasks[task_id]
            for result in runner_results:
                task.done += 1
                if result.error_msg is None and result.run_secs:
                    seconds = sum(float(s) for s in result.run_secs) / len(result.run_secs)
                    if task.best_us is None or seconds * 1e6 < task.best_us:
                        task.best_us = seconds * 1e6
            reporter.trials_measured(task)
            if stopped[0] or (deadline is not None and time.monotonic() > deadline):
                # terminating tasks from here trips the scheduler's own checks; unwinding is clean, and
                # every record measured so far is already in the database (AddToDatabase runs first)
                stopped[0] = True
                raise BudgetSpent()

    return ProgressAndBudget()


# ---------------------------------------------------------------- tuning

class TuningInterrupted(UsageError):
    """Ctrl-C during tuning: the database holds what was measured; exit 130 like any interrupt."""

    exit_code = 130


def _stop_on_interrupt(stopped: list[bool], interrupted: list[bool]) -> Any:
    """Ctrl-C ends tuning at the next measured batch, like a spent budget. A KeyboardInterrupt raised inside
    MetaSchedule's Python callbacks (called from C++) crashed the process (SIGSEGV), so the handler only
    sets flags. Returns the previous handler (None off the main thread, where signals cannot be set)."""
    import threading

    if threading.current_thread() is not threading.main_thread():
        return None

    def handler(signum: int, frame: Any) -> None:
        stopped[0] = interrupted[0] = True

    return signal.signal(signal.SIGINT, handler)


@dataclass
class RpcSpec:
    """MetaSchedule's RPC runner against a TVM tracker (`python -m tvm.exec.rpc_tracker`)."""

    host: str
    port: int
    key: str
    session_timeout_s: float = 120.0

    @classmethod
    def parse(cls, tracker: str, key: str | None) -> RpcSpec:
        host, sep, port = tracker.rpartition(":")
        if not sep or not host or not port.isdigit():
            raise UsageError(f"--rpc-tracker '{tracker}': expected HOST:PORT; fix: e.g. --rpc-tracker 127.0.0.1:9190")
        if not key:
            raise UsageError("--rpc-tracker needs --rpc-key (the key the RPC servers registered with); "
                             "fix: add --rpc-key KEY")
        return cls(host, int(port), key)


@dataclass
class TuneResult:
    database: Path
    target: dict[str, Any]
    tasks: list[Task]
    skipped: list[Task]
    workloads: list[str]
    seconds: float
    stopped_by_budget: bool
    cost_model: str

    def summary(self) -> dict[str, Any]:
        def row(task: Task) -> dict[str, Any]:
            return {"task": task.name, "workloads": task.workloads, "records_before": task.records,
                    "trials": task.done, "best_us": None if task.best_us is None else round(task.best_us, 3)}

        return {"database": str(self.database), "target": self.target, "cost_model": self.cost_model,
                "seconds": round(self.seconds, 1), "stopped_by_budget": self.stopped_by_budget,
                "workloads": self.workloads, "tuned": [row(t) for t in self.tasks],
                "already_tuned": [row(t) for t in self.skipped]}


def _host_tensor_intrinsics_only() -> None:
    """Register only this CPU's tensor intrinsics before MetaSchedule asks for all of them.

    `TuneContext` imports `tvm.s_tir.tensor_intrin`, which registers every target's intrinsics:
    20-40 s here, 12 s of it CUDA's. An llvm tuning run needs only the host's family (x86 or Arm),
    so the package is registered without its __init__ and only that submodule is imported.
    """
    import importlib
    import importlib.util
    import platform
    import sys

    package = "tvm.s_tir.tensor_intrin"
    if package in sys.modules:
        return
    family = {"x86_64": "x86", "amd64": "x86", "aarch64": "arm_cpu", "arm64": "arm_cpu"}.get(platform.machine().lower())
    spec = importlib.util.find_spec(package)
    if family is None or spec is None:
        return
    sys.modules[package] = importlib.util.module_from_spec(spec)
    try:
        importlib.import_module(f"{package}.{family}")
    except Exception:  # fall back to the full import MetaSchedule would have done anyway
        del sys.modules[package]


def _require_tuning_extras() -> None:
    from importlib.util import find_spec

    missing = [m for m in ("psutil", "cloudpickle") if find_spec(m) is None]
    if missing:
        raise UsageError(f"tuning needs {', '.join(missing)} (MetaSchedule's worker pool); fix: {TUNING_EXTRAS}")


def cost_model_kind() -> str:
    """XGBoost (the xgboost-cpu wheel, no 351 MB NCCL) when installed; else random search, which also tunes."""
    from importlib.util import find_spec

    return "xgb" if find_spec("xgboost") is not None else "random"


def _runner(rpc: RpcSpec | None) -> Any:
    ms = require("tvm.s_tir.meta_schedule")
    evaluator = ms.runner.EvaluatorConfig(number=20, repeat=3, min_repeat_ms=50, enable_cpu_cache_flush=False)
    if rpc is None:
        return ms.runner.LocalRunner(evaluator_config=evaluator, timeout_sec=60)
    from importlib.util import find_spec

    if find_spec("tornado") is None:
        raise UsageError(f"--rpc-tracker needs tornado (TVM's RPC); fix: {TUNING_EXTRAS}")
    config = ms.runner.RPCConfig(tracker_host=rpc.host, tracker_port=rpc.port, tracker_key=rpc.key,
                                 session_timeout_sec=int(rpc.session_timeout_s))
    return ms.runner.RPCRunner(rpc_config=config, evaluator_config=evaluator, max_workers=1)


def search_strategy(trials: int) -> Any:
    """Evolutionary search sized to the budget: the stock population (512) costs ~10 s per kernel per round here,
    which only pays off for real budgets; a few trials get a small population."""
    ms = require("tvm.s_tir.meta_schedule")
    population = max(32, min(512, trials * 8))
    return ms.search_strategy.EvolutionarySearch(population_size=population,
                                                 init_min_unmeasured=max(8, min(50, population // 8)),
                                                 genetic_num_iters=4 if trials >= 32 else 2)


def check_budget(trials: int, time_budget_s: float | None) -> None:
    if trials < 1:
        raise UsageError(f"--trials {trials}: must be >= 1")
    if time_budget_s is not None and time_budget_s <= 0:
        raise UsageError(f"--time-budget {time_budget_s}: must be > 0 seconds")
    _require_tuning_extras()


def tune_workloads(workloads: list[Workload], target_dict: dict[str, Any], directory: Path, *, trials: int,
                   time_budget_s: float | None = None, rpc: RpcSpec | None = None,
                   reporter: TuneReporter | None = None, seed: int = 0) -> TuneResult:
    """Tune `workloads` with `trials` measured candidates per workload (shape), into the database in `directory`.

    A workload already tuned with at least `trials` (meta.json) whose kernels all have records is
    skipped; the others are tuned together, seeded by any records they already have.
    """
    check_budget(trials, time_budget_s)
    started = time.monotonic()
    if target_dict.get("kind") == "llvm":
        _host_tensor_intrinsics_only()
    reporter = reporter or _SilentTuning()
    tvm = require("tvm")
    ms = require("tvm.s_tir.meta_schedule")
    from rlopt.backends.tvm.builder import build_candidate

    target = tvm.target.Target(target_dict)
    database = open_database(directory, create=True)
    all_tasks = extract_tasks(workloads, target)
    for task in all_tasks:
        task.records = count_records(database, task, trials)
    known = read_meta(directory).get("workloads", {})

    def already_tuned(workload: Workload) -> bool:
        """Every kernel has records, and meta.json says a run with `trials` finished (or the records alone add up)."""
        kernels = [t for t in all_tasks if workload.key in t.workloads]
        previous = known.get(workload.key, {})
        finished = int(previous.get("trials", 0)) >= trials and not previous.get("partial", False)
        return all(t.records > 0 for t in kernels) and (finished or sum(t.records for t in kernels) >= trials)

    pending = [w for w in workloads if not already_tuned(w)]
    pending_keys = {w.key for w in pending}
    to_tune = [t for t in all_tasks if pending_keys & set(t.workloads)]
    skipped = [t for t in all_tasks if t not in to_tune]
    for task in to_tune:
        task.trials = trials
    reporter.tuning_started(to_tune, skipped)
    stopped, interrupted = [False], [False]
    kind = cost_model_kind()
    if to_tune:
        logging.getLogger("tvm.s_tir.meta_schedule").setLevel(logging.WARNING)
        cores = int(target_dict.get("num-cores") or host_cores())
        # runner workers inherit it: unset, TVM measures every candidate on half the cores (1 on a 2-core VM)
        os.environ.setdefault("TVM_NUM_THREADS", str(cores))
        scratch = Path(tempfile.mkdtemp(prefix="rlopt-tune-"))
        try:
            contexts, weights = ms.relax_integration.extracted_tasks_to_tune_contexts(
                [t.extracted for t in to_tune], str(scratch), strategy=search_strategy(trials), seed=seed,
                num_threads=cores)
            deadline = None if time_budget_s is None else started + time_budget_s
            callbacks = list(ms.measure_callback.MeasureCallback.create("default"))
            callbacks.append(_progress_callback(to_tune, reporter, deadline, stopped))
            # small enough that the first round reaches every kernel (the budget is per shape, not per kernel)
            per_iter = max(1, min(16, trials * len(pending) // (2 * len(to_tune))))
            previous_handler = _stop_on_interrupt(stopped, interrupted)
            try:
                ms.tune.tune_tasks(
                    tasks=contexts, task_weights=weights, work_dir=str(scratch),
                    max_trials_global=max(trials * len(pending), len(to_tune)), max_trials_per_task=trials,
                    num_trials_per_iter=per_iter,
                    builder=ms.builder.LocalBuilder(f_build=build_candidate, max_workers=cores, timeout_sec=120),
                    runner=_runner(rpc), database=database, cost_model=kind, measure_callbacks=callbacks)
            except Exception:  # BudgetSpent comes back through TVM's FFI as its own error type
                if not stopped[0]:
                    raise
            finally:
                if previous_handler is not None:
                    signal.signal(signal.SIGINT, previous_handler)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    def meta_entry(workload: Workload) -> dict[str, Any]:
        previous, tuned_now = known.get(workload.key, {}), workload.key in pending_keys
        return {"points": workload.points, "tasks": [t.name for t in all_tasks if workload.key in t.workloads],
                "trials": trials if tuned_now else int(previous.get("trials", trials)),
                "partial": stopped[0] and tuned_now}

    if to_tune:
        prune_records(directory)
        _OPENED.clear()
    write_meta(directory, target_dict, kind, {w.key: meta_entry(w) for w in workloads})
    reporter.tuning_finished(stopped[0] and not interrupted[0])
    if interrupted[0]:
        raise TuningInterrupted(f"tuning interrupted; the records measured so far are in {directory}; "
                                f"fix: run the same 'rlopt tune' again to resume")
    return TuneResult(directory, target_dict, to_tune, skipped, [w.key for w in workloads],
                      time.monotonic() - started, stopped[0], kind)


# ---------------------------------------------------------------- `rlopt tune RECIPE`

def network_onnx(recipe: Recipe, recipe_path: Path, model: Any, name: str, spec: NetworkSpec, workdir: Path) -> Any:
    """The ONNX model compile feeds to TVM for this network (same stages, same options)."""
    onnx = require("onnx")
    from rlopt.stages.export_onnx import export_onnx
    from rlopt.stages.load_model import submodule
    from rlopt.stages.script import script_network

    module = submodule(model, spec.module, recipe_path, name)
    script_network(module, workdir / f"{name}.ts", recipe_path=recipe_path, network=name, module_path=spec.module)
    out = export_onnx(workdir / f"{name}.ts", spec, recipe.onnx.opset, workdir / f"{name}.onnx",
                      recipe_path=recipe_path, network=name)
    source = out.artifact
    from rlopt.compile.gpu_path import padding_multiples, wanted_multiple

    if padding_multiples(recipe).get("tvm", 0) > 0 and wanted_multiple(recipe) > 0:
        # compile feeds TVM model.padded.onnx then: tune the same kernels
        from rlopt.reference import random_input
        from rlopt.stages.pad_gemm import pad_gemm

        rng = np.random.default_rng(0)
        feeds = [{n: random_input(rng, s, s.dims(p)) for n, s in spec.inputs.items()} for p in ("min", "opt", "max")]
        padded = pad_gemm(source, wanted_multiple(recipe), workdir / f"{name}.padded.onnx", feeds,
                          recipe_path=recipe_path, network=name)
        source = padded.artifact or source
    return onnx.load(str(source))


def recipe_workloads(recipe: Recipe, recipe_path: Path, networks: list[str] | None, workdir: Path) -> list[Workload]:
    from rlopt.stages.load_model import build_model

    unknown = [n for n in networks or [] if n not in recipe.networks]
    if unknown:
        raise UsageError(located(recipe_path, "networks", f"no network '{unknown[0]}'",
                                 f"use one of {', '.join(recipe.networks)}"))
    model, _ = build_model(recipe.model, recipe_path)
    workloads = []
    for name, spec in recipe.networks.items():
        if networks and name not in networks:
            continue
        onnx_model = network_onnx(recipe, recipe_path, model, name, spec, workdir)
        workloads.extend(Workload(name, points, shapes, onnx_model) for points, shapes in profile_shapes(spec))
    return workloads


def tune_recipe(recipe_path: Path | str, *, trials: int = 64, time_budget_s: float | None = None,
                rpc: RpcSpec | None = None, networks: list[str] | None = None,
                reporter: TuneReporter | None = None) -> TuneResult:
    """`rlopt tune`: tune every network of a recipe at each profile shape into `<recipe>.tuning/<target>/`."""
    check_budget(trials, time_budget_s)
    recipe_path = Path(recipe_path)
    recipe = load_recipe(recipe_path)
    if recipe.tvm.target.get("kind") != "llvm":
        raise UsageError(located(recipe_path, "tvm.target", f"tuning here supports kind llvm, not "
                                 f"'{recipe.tvm.target.get('kind')}'", "tune CUDA targets on a GPU machine"))
    target = resolve_target(recipe.tvm.target)
    with tempfile.TemporaryDirectory(prefix="rlopt-tune-onnx-") as workdir:
        workloads = recipe_workloads(recipe, recipe_path, networks, Path(workdir))
        return tune_workloads(workloads, target, database_dir(recipe_path, target), trials=trials,
                              time_budget_s=time_budget_s, rpc=rpc, reporter=reporter)


__all__ = ["tune_recipe", "tune_workloads", "resolve_target", "database_dir", "open_database", "apply_database",
           "profile_shapes", "shape_key", "file_slug", "Workload", "RpcSpec", "TuneResult", "TuneReporter"]
