"""Stage: TVM (Relax, 0.27) libraries from ONNX for an llvm target: one dynamic, one tuned static per profile shape.

- The dynamic library (`tvm-<target>.so`) serves every shape in [min, max]; it is correct but
  untuned (tuning a symbolic-shape module fails in 0.27, shared notes).
- One static library per distinct profile shape (`tvm-<target>-<dims>.so`), with the taken
  branch of shape-only Ifs inlined and every kernel that has a record in the recipe's tuning
  database (`<recipe>.tuning/<kind-mcpu>/`, see rlopt.backends.tvm.tuning) replaced by its tuned schedule.
  The runtime dispatches to it on an exact shape match. Kernels without a record are listed
  (`untuned_kernels`), so a user sees which workloads `rlopt tune` still has to cover, and get a rule schedule
  (rlopt.backends.tvm.schedules; `rule_kernels`, or `default_kernels` where no rule applies), as the dynamic
  library's kernels do.
- The target is completed for this host (mcpu, num-cores); the ISA features that mcpu implies
  are recorded, so a runtime on a CPU without them refuses to load instead of dying on SIGILL.
- The weights are parameters, not constants: every library takes them after the inputs, and one params
  file per network (`tvm-<target>.params.npz`, keyed by initializer) holds them, so `rlopt refit` writes a
  new file and reuses the libraries (see rlopt.backends.tvm.params and refit).
- The TVM thread count is chosen by measuring the static libraries at 1..N threads.
"""

from __future__ import annotations

import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

from rlopt.errors import BackendUnavailable, RecipeError, StageError, located
from rlopt.lazy import require
from rlopt.arrays import shape_label
from rlopt.backends.tvm.config import TvmConfig
from rlopt.backends.tvm.facts import TUNE_HINT, TvmFacts
from rlopt.spec import NetworkSpec
from rlopt.stages.base import StageOutput
from rlopt.backends.tvm.importer import (fold_weight_layouts, fused_kernels, import_relax, scheduled_kernels,
                                     tensorize_shape_comparisons)

__all__ = ["build_tvm", "target_slug", "fused_kernels", "tensorize_shape_comparisons"]

PIPELINE = "tensorize shape comparisons + fold shape-only Ifs (static) + ConvertToDataflow + relax 'zero' pipeline"


def target_slug(target: dict[str, Any]) -> str:
    """`tvm-<slug>.so`: the kind plus what picks the code (mcpu or arch), as the tuning database folder names it."""
    from rlopt.backends.tvm.database import target_key

    return target_key(target)


def _error_line(exc: BaseException) -> str:
    """The line that says what went wrong: TVM's errors put its C++ backtrace first and the error itself last."""
    text = str(exc).strip()
    return text.splitlines()[-1] if text else type(exc).__name__


def _compile(mod: Any, target: Any, out_path: Path, recipe_path: Path, network: str) -> None:
    tvm = require("tvm")
    try:
        tvm.compile(mod, target).export_library(str(out_path))
    except Exception as exc:  # the TVM compiler raises many error types
        raise StageError(located(recipe_path, f"networks.{network}", f"TVM cannot compile the ONNX model: "
                                 f"{_error_line(exc)}", "use operators TVM's Relax ONNX frontend supports, "
                                 "or drop tvm from backends")) from None


def _import(model: Any, target: Any, shapes: dict[str, list[int]] | None, recipe_path: Path,
            network: str, spec: NetworkSpec | None = None) -> tuple[Any, dict[str, Any]]:
    bounds = None if spec is None else tuple({n: s.dims(p) for n, s in spec.inputs.items()} for p in ("min", "max"))
    try:
        return import_relax(model, target, shapes, weights_as_params=True, bounds=bounds)
    except BackendUnavailable:  # an op the frontend has no converter for: TVM is skipped, the others go on
        raise
    except Exception as exc:  # the TVM frontend raises many error types
        raise StageError(located(recipe_path, f"networks.{network}", f"TVM cannot import the ONNX model: "
                                 f"{_error_line(exc)}", "use operators TVM's Relax ONNX frontend supports, "
                                 "or drop tvm from backends")) from None


def _scheduled_by_rules(mod: Any, target: Any, config: TvmConfig) -> tuple[Any, dict[str, str], list[str]]:
    """`mod` with rlopt's schedule rules applied to every kernel without a tuning record (unless the recipe turned
    them off), kernel -> rule for the kernels a rule scheduled, and those of them with a parallel loop."""
    if not config.schedule_rules:
        return mod, {}, []
    from rlopt.backends.tvm.schedules import apply_rules

    mod, report = apply_rules(mod, target)
    return mod, report.scheduled, report.parallel


def kernel_split(mod: Any) -> tuple[list[str], list[str]]:
    """(tuned, untuned) kernels with arithmetic; pure data movement (take, reshape: an estimate of at most one
    flop) is never tuned, so not listed. A kernel the flop estimator refuses is listed: nothing shows it does no
    arithmetic, and the manifest must not under-report what runs untuned."""
    analysis = require("tvm.s_tir.analysis")
    tvm = require("tvm")
    scheduled, unscheduled = scheduled_kernels(mod)
    untuned = []
    for name in unscheduled:
        try:
            flop = float(analysis.estimate_tir_flops(tvm.IRModule({"main": mod[name]})))
        except Exception:  # TVM's estimator raises its own error types (TVMError, ValueError, ...)
            flop = math.inf
        if flop > 1:
            untuned.append(name)
    return scheduled, untuned


def output_shapes(mod: Any) -> list[list[int]] | None:
    """The static output shapes of `mod`'s main, flattened in the order the runner returns them; None when any is
    not static (a runner cannot then slice a padded bucket's outputs)."""
    found: list[list[int]] = []

    def walk(kind: Any) -> bool:
        if hasattr(kind, "fields"):
            return all(walk(field) for field in kind.fields)
        values = getattr(getattr(kind, "shape", None), "values", None)
        if values is None or not all(hasattr(d, "value") for d in values):
            return False
        found.append([int(d.value) for d in values])
        return True

    return found if walk(mod["main"].ret_ty) else None


def required_cpu_features(target_dict: dict[str, Any]) -> list[str]:
    """ISA features (LLVM names) the target's mcpu lets the code use."""
    from rlopt.backends.tvm.cpu_features import isa_features

    if target_dict.get("kind") != "llvm" or not target_dict.get("mcpu"):
        return []
    tvm = require("tvm")
    codegen = require("tvm.target.codegen")
    return isa_features(codegen.llvm_get_cpu_features(tvm.target.Target(target_dict)))


MULTITHREAD_MIN_SPEEDUP = 1.1
THREAD_ROUNDS = 5
_pool_lock = threading.Lock()


def _interleaved_medians_us(call: Callable[[], object], configure: Callable[[int, int], object],
                            candidates: list[int], budget_s: float) -> dict[str, float]:
    """Median call time per thread count, alternating the counts round by round so drift hits all alike."""
    import numpy as np

    samples: dict[int, list[int]] = {n: [] for n in candidates}
    for _ in range(THREAD_ROUNDS):
        for threads in candidates:
            configure(1, threads)
            call()  # the first call after re-sizing the pool wakes its workers: not timed
            deadline = time.perf_counter() + budget_s / THREAD_ROUNDS
            count = 0
            while count < 2 or (time.perf_counter() < deadline and count < 100):
                start = time.perf_counter_ns()
                call()
                samples[threads].append(time.perf_counter_ns() - start)
                count += 1
    return {str(n): round(float(np.median(v)) / 1e3, 2) for n, v in samples.items()}


def choose_threads(builds: list[tuple[dict[str, list[int]], Path, list[str]]], dtypes: dict[str, str], cores: int,
                   weights: dict[str, Any], budget_s: float = 0.1) -> tuple[int, dict[str, dict[str, float]]]:
    """Time each tuned static library (shapes, path, its parameter names) at 1..`cores` TVM threads, in this
    process, on `weights`; more than 1 for a clear win.

    TVM sizes its pool once, from TVM_NUM_THREADS (default: half the cores), so this sets it to `cores`
    unless the pool already runs or the user set it. Re-sizing the pool (`runtime.config_threadpool`)
    pins the calling thread to one core unless TVM_BIND_THREADS=0, which is set only while this runs.
    The pool is left at the chosen count, so the latency measured next is the one users get.
    """
    import numpy as np

    os.environ.setdefault("TVM_NUM_THREADS", str(max(1, cores)))
    candidates = sorted({1, max(1, min(cores, int(os.environ["TVM_NUM_THREADS"])))})
    if len(candidates) == 1 or not builds:
        return 1, {}  # nothing tuned (serial kernels) or one core: more threads would only add idle workers
    tvm = require("tvm")
    relax = require("tvm.relax")
    from rlopt.backends.tvm.params import bind_params

    configure = require("tvm_ffi").get_global_func("runtime.config_threadpool")
    table: dict[str, dict[str, float]] = {}
    with _pool_lock:
        previous = os.environ.get("TVM_BIND_THREADS")
        os.environ["TVM_BIND_THREADS"] = "0"
        try:
            for shapes, path, names in builds:
                vm = relax.VirtualMachine(tvm.runtime.load_module(str(path)), tvm.cpu())
                main = vm["main"]
                args = [tvm.runtime.tensor(np.zeros(dims, dtype=dtypes[name])) for name, dims in shapes.items()]
                args += bind_params(tvm, vm, names, weights, tvm.cpu())
                key = shape_label(shapes.values())
                table[key] = _interleaved_medians_us(lambda: main(*args), configure, candidates, budget_s)

            def speedup(threads: int) -> float:
                """Geometric mean over shapes of (1-thread latency / latency at `threads`)."""
                ratios = [row["1"] / row[str(threads)] for row in table.values()]
                return float(np.prod(ratios) ** (1 / len(ratios)))

            # more threads only for a clear win: a parallel kernel whose worker is descheduled (another busy
            # process on the same cores) stalls for a scheduler quantum, which 1 thread never does
            wins = [n for n in candidates if n > 1 and speedup(n) >= MULTITHREAD_MIN_SPEEDUP]
            chosen = max(wins, key=speedup) if wins else 1
            configure(1, chosen)
        finally:
            if previous is None:
                os.environ.pop("TVM_BIND_THREADS", None)
            else:
                os.environ["TVM_BIND_THREADS"] = previous
    return chosen, table


def build_tvm(onnx_path: Path, config: TvmConfig, out_dir: Path, *, recipe_path: Path, network: str,
              spec: NetworkSpec | None = None) -> StageOutput:
    """The dynamic library (the artifact) plus, given the network's spec, one static library per profile shape."""
    kind = config.target.get("kind")
    if kind != "llvm":
        raise BackendUnavailable(f"TVM target kind '{kind}' is not built by this rlopt on this machine "
                                 "(only {kind: llvm} is supported here)")
    onnx = require("onnx")
    tvm = require("tvm")
    from rlopt.backends.tvm.database import resolve_target

    try:
        target_dict = resolve_target(config.target)
        target = tvm.target.Target(target_dict)
    except Exception as exc:  # tvm raises its own error types for a bad target dict: the recipe's, exit 2
        raise RecipeError(located(recipe_path, "tvm.target", f"TVM rejects {config.target} ({str(exc).splitlines()[0]})",
                                 "give a TVM JSON target dict such as {kind: llvm, mcpu: znver4}")) from None
    model = onnx.load(str(onnx_path))
    slug = target_slug(config.target)  # the name the recipe asked for; facts record the resolved target
    mod, imported = _import(model, target, None, recipe_path, network, spec)
    mod, imported["rule_kernels"], _ = _scheduled_by_rules(mod, target, config)
    mod = fold_weight_layouts(mod, weights_as_params=True)
    out_path = out_dir / f"tvm-{slug}.so"
    # LLVM code generation and linking run outside the GIL: libraries build side by side, one per core
    pool = ThreadPoolExecutor(max_workers=max(1, min(4, int(target_dict.get("num-cores") or 1))))
    try:
        return _build_all(pool, mod, imported, model, target, target_dict, config, out_dir, out_path, slug,
                          recipe_path, network, spec, onnx_path.name)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _build_all(pool: ThreadPoolExecutor, mod: Any, imported: dict[str, Any], model: Any, target: Any,
               target_dict: dict[str, Any], config: TvmConfig, out_dir: Path, out_path: Path, slug: str,
               recipe_path: Path, network: str, spec: NetworkSpec | None, onnx_name: str) -> StageOutput:
    tvm = require("tvm")
    from rlopt.files import file_record
    from rlopt.backends.tvm.database import (Workload, apply_database, choose_database, database_dir, file_slug,
                                             open_database, profile_shapes, target_key)
    from rlopt.backends.tvm.tuning import tune_workloads

    dynamic = pool.submit(_compile, mod, target, out_path, recipe_path, network)
    weights = imported.pop("params")
    facts: dict[str, Any] = {"param_names": list(weights), "target": target_dict, "cpu_features": required_cpu_features(target_dict),
                             "tuned": False, "fused_kernels": imported["fused_kernels"],
                             "rule_kernels": imported["rule_kernels"],
                             "shape_comparisons_tensorized": imported["shape_comparisons_tensorized"],
                             "pipeline": PIPELINE, "tvm": tvm.__version__}
    if spec is None:
        dynamic.result()
        facts["params"] = _write_params(out_dir, slug, weights, onnx_name, recipe_path, network)
        return StageOutput(out_path, TvmFacts(**facts))

    workloads = [Workload(network, points, shapes, model) for points, shapes in profile_shapes(spec)]
    choice = choose_database(recipe_path, target_dict)
    if config.tune_trials > 0:
        choice = type(choice)(database_dir(recipe_path, target_dict), True, "tuned here")
        tune_workloads(workloads, target_dict, choice.directory, trials=config.tune_trials)
    db_dir = choice.directory
    database = open_database(db_dir, create=False) if choice.found else None

    def build_static(workload: Workload) -> tuple[dict[str, Any], Path]:
        """One shape's library: import, tuned schedules, weights pre-packed (FoldConstant runs the re-layout now,
        ~0.45 s a shape on atari), compiled. Whole in the pool: TVM's passes and LLVM run outside the GIL."""
        static, static_facts = _import(model, target, workload.shapes, recipe_path, network)
        if database is not None:
            static = apply_database(static, target, database)
        tuned, untuned = kernel_split(static)
        static, rules, parallel = _scheduled_by_rules(static, target, config)
        static = fold_weight_layouts(static, weights_as_params=True)
        path = out_dir / f"tvm-{slug}-{file_slug(workload.shapes)}.so"
        _compile(static, target, path, recipe_path, network)
        return {"points": workload.points, "shapes": workload.shapes, "output_shapes": output_shapes(static),
                "tuned_kernels": tuned, "untuned_kernels": untuned, "rule_kernels": rules,
                "default_kernels": [name for name in untuned if name not in rules], "parallel_kernels": parallel,
                "param_names": list(static_facts["params"]),
                "ifs_folded": static_facts.get("ifs_folded", 0), "weights": static_facts["params"]}, path

    statics = [pool.submit(build_static, workload) for workload in workloads]
    done = [future.result() for future in statics]
    dynamic.result()
    builds = [build for build, _ in done]
    for build in builds:
        weights = _merge_weights(weights, build.pop("weights"), recipe_path, network)
    facts["params"] = _write_params(out_dir, slug, weights, onnx_name, recipe_path, network)
    libraries = [(workload.shapes, path, build["param_names"]) for workload, build, (_, path)
                 in zip(workloads, builds, done)]
    for build, (_, path, _) in zip(builds, libraries):
        build["file"] = file_record(out_dir.parent, path).model_dump()
    # kernels with TVM's default loops run serially, so only libraries with tuned kernels or rule-scheduled parallel
    # loops say what threads are worth
    tuned_libraries = [lib for lib, build in zip(libraries, builds)
                       if build["tuned_kernels"] or build["parallel_kernels"]]
    threads, thread_table = choose_threads(tuned_libraries, {n: s.dtype for n, s in spec.inputs.items()},
                                           int(target_dict.get("num-cores") or 1), weights)
    missing = [f"{b['points'][0]} {file_slug(b['shapes'])}" for b in builds if b["untuned_kernels"]]
    facts.update({
        "tuned": any(b["tuned_kernels"] for b in builds), "shape_builds": builds,
        "database": {"dir": f"{db_dir.parent.name}/{db_dir.name}",
                     "target_key": target_key(target_dict), "found": database is not None,
                     "borrowed": choice.borrowed, "reason": choice.reason},
        "num_threads": threads, "thread_latency_us": thread_table,
        "tuning_summary": (f"tuned {len(builds) - len(missing)}/{len(builds)} shapes"
                           + (f" with the {db_dir.name} database{' (borrowed)' if choice.borrowed else ''} "
                              f"({choice.reason})" if choice.found and db_dir.name != target_key(target_dict) else "")
                           + (f"; no record for {', '.join(missing)}: run '{TUNE_HINT}'" if missing
                              else "") + _rules_summary(builds)),
    })
    return StageOutput(out_path, TvmFacts(**facts))


def _rules_summary(builds: list[dict[str, Any]]) -> str:
    """'; rules scheduled 6/6 untuned kernels (dense 4, rows 2)' over every shape's library, or ''."""
    from collections import Counter

    untuned = sum(len(b["untuned_kernels"]) for b in builds)
    used = Counter(rule for b in builds for name, rule in b["rule_kernels"].items() if name in b["untuned_kernels"])
    if not untuned:
        return ""
    return (f"; rules scheduled {sum(used.values())}/{untuned} untuned kernels"
            + (f" ({', '.join(f'{rule} {count}' for rule, count in sorted(used.items()))})" if used else ""))


def _merge_weights(known: dict[str, Any], more: dict[str, Any], recipe_path: Path, network: str) -> dict[str, Any]:
    """One params file serves every library: a name two libraries share must hold the same array."""
    import numpy as np

    merged = dict(known)
    for name, array in more.items():
        if name in merged and not np.array_equal(merged[name], array):
            raise StageError(located(recipe_path, f"networks.{network}", f"TVM libraries disagree on weight "
                                     f"'{name}' (two If branches share a name)", "drop tvm from backends"))
        merged[name] = array
    return merged


def _write_params(out_dir: Path, slug: str, weights: dict[str, Any], onnx_name: str, recipe_path: Path,
                  network: str) -> dict[str, Any]:
    """The params file beside the libraries and its facts (file record, source ONNX, names)."""
    from rlopt.files import file_record
    from rlopt.backends.tvm.params import write_params

    path = out_dir / f"tvm-{slug}.params.npz"
    write_params(path, weights)
    return {"file": file_record(out_dir.parent, path).model_dump(), "onnx": onnx_name,
            "padded": onnx_name == "model.padded.onnx", "names": list(weights)}
