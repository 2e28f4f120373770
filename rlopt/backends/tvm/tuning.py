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

import logging
import os
import shutil
import signal
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlopt.backends.tvm.database import (
    TUNING_EXTRAS,
    Workload,
    file_slug,
    forget_opened,
    host_cores,
    open_database,
    prune_records,
    read_meta,
    write_meta,
)
from rlopt.backends.tvm.measuring import RpcSpec, make_builder, make_runner, stop_workers
from rlopt.errors import UsageError
from rlopt.lazy import require


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


BUDGET_SPENT = "rlopt: the tuning budget is spent"


class BudgetSpent(Exception):
    """Raised from the measure callback to end tuning when --time-budget is spent (or Ctrl-C was pressed). It comes
    back through TVM's FFI as a RuntimeError carrying only its message: `ended_by_budget` tells it by that."""

    def __init__(self) -> None:
        super().__init__(BUDGET_SPENT)


def ended_by_budget(exc: BaseException) -> bool:
    """Whether `exc`, raised out of MetaSchedule's tune_tasks, is our own BudgetSpent and nothing else."""
    return isinstance(exc, BudgetSpent) or BUDGET_SPENT in str(exc)


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
            builder, runner = make_builder(cores, scratch / "artifacts"), make_runner(rpc)
            previous_handler = _stop_on_interrupt(stopped, interrupted)
            try:
                ms.tune.tune_tasks(
                    tasks=contexts, task_weights=weights, work_dir=str(scratch),
                    max_trials_global=max(trials * len(pending), len(to_tune)), max_trials_per_task=trials,
                    num_trials_per_iter=per_iter, builder=builder, runner=runner, database=database,
                    cost_model=kind, measure_callbacks=callbacks)
            except Exception as exc:  # any error but the budget's own stop is the tune's failure, spent or not
                if not (stopped[0] and ended_by_budget(exc)):
                    raise
            finally:
                if previous_handler is not None:
                    signal.signal(signal.SIGINT, previous_handler)
                stop_workers(runner)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    def meta_entry(workload: Workload) -> dict[str, Any]:
        previous, tuned_now = known.get(workload.key, {}), workload.key in pending_keys
        return {"points": workload.points, "tasks": [t.name for t in all_tasks if workload.key in t.workloads],
                "trials": trials if tuned_now else int(previous.get("trials", trials)),
                "partial": stopped[0] and tuned_now}

    if to_tune:
        prune_records(directory)
        forget_opened()
    write_meta(directory, target_dict, kind, {w.key: meta_entry(w) for w in workloads})
    reporter.tuning_finished(stopped[0] and not interrupted[0])
    if interrupted[0]:
        raise TuningInterrupted(f"tuning interrupted; the records measured so far are in {directory}; "
                                f"fix: run the same 'rlopt tune' again to resume")
    return TuneResult(directory, target_dict, to_tune, skipped, [w.key for w in workloads],
                      time.monotonic() - started, stopped[0], kind)


__all__ = [
    "RpcSpec",
    "Task",
    "TuneReporter",
    "TuneResult",
    "TuningInterrupted",
    "Workload",
    "check_budget",
    "extract_tasks",
    "is_tunable",
    "tune_workloads",
]
