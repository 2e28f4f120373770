"""Tuned TVM: static workloads with the If folded, the tuning database, shape dispatch, the lean call path.

MetaSchedule runs here with tiny trial counts (it pays 20-40 s of worker set-up per call); those
tests, and the RPC tracker/server one, are marked slow.
"""

from __future__ import annotations

import contextlib
import json
import logging
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest

import rlopt
from rlopt.errors import ArtifactError, UsageError
from rlopt.manifest import read_manifest
from rlopt.recipe import load_recipe
from tests.conftest import assert_one_line_error, run_rlopt, write_tiny_recipe

STATIC_NETWORK = """\
name: tiny-static
model:
  factory: models/policy_heads.py:PolicyValueHeads
  kwargs: {hidden: 32, width: 16, n_actions: 5}
  seed: 3
networks:
  policy:
    module: policy
    kind: policy
    inputs:
      input0: {dtype: float32, shape: [2, 3, 32]}
    outputs: [logits]
backends: [onnxruntime, tvm]
verify:
  samples: 2
"""


def _static_recipe(folder: Path) -> Path:
    write_tiny_recipe(folder)  # copies the model code
    path = folder / "static.yaml"
    path.write_text(STATIC_NETWORK)
    return path


@pytest.fixture(scope="module")
def policy_onnx(tmp_path_factory: pytest.TempPathFactory) -> onnx.ModelProto:
    from rlopt.stages.export_onnx import export_onnx
    from rlopt.user_model import build_model, submodule
    from rlopt.stages.script import script_network

    folder = tmp_path_factory.mktemp("tuning-onnx")
    recipe_path = write_tiny_recipe(folder)
    recipe = load_recipe(recipe_path)
    model, _ = build_model(recipe.model, recipe_path)
    script_network(submodule(model, "policy", recipe_path, "policy"), folder / "p.ts", recipe_path=recipe_path,
                   network="policy", module_path="policy")
    export_onnx(folder / "p.ts", recipe.networks["policy"], 17, folder / "p.onnx", recipe_path=recipe_path,
                network="policy")
    return onnx.load(str(folder / "p.onnx"))


def _ort(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"input0": x})[0]


# ---------------------------------------------------------------- static workloads

@pytest.mark.parametrize(("shape", "branch_ops"), [([1, 1, 32], "Squeeze"), ([3, 2, 32], None)])
def test_static_shape_folds_the_if_and_keeps_the_maths(policy_onnx: onnx.ModelProto, shape: list[int],
                                                       branch_ops: str | None) -> None:
    from rlopt.backends.tvm.importer import fold_static_ifs, tensorize_shape_comparisons

    model = onnx.ModelProto()
    model.CopyFrom(policy_onnx)
    tensorize_shape_comparisons(model)
    assert fold_static_ifs(model, {"input0": shape}) == 1
    assert "If" not in {n.op_type for n in model.graph.node}
    onnx.checker.check_model(model)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(_ort(model, x), _ort(policy_onnx, x), atol=1e-6)


def test_if_fed_by_data_is_not_folded(policy_onnx: onnx.ModelProto) -> None:
    from onnx import helper

    from rlopt.backends.tvm.importer import fold_static_ifs

    model = onnx.ModelProto()
    model.CopyFrom(policy_onnx)
    if_node = next(n for n in model.graph.node if n.op_type == "If")
    # a condition computed from the input's values cannot be known from its shape
    model.graph.node.insert(0, helper.make_node("ReduceMax", ["input0"], ["data_max"], keepdims=0))
    model.graph.node.insert(1, helper.make_node("Cast", ["data_max"], ["data_cond"], to=onnx.TensorProto.BOOL))
    if_node.input[0] = "data_cond"
    assert fold_static_ifs(model, {"input0": [1, 1, 32]}) == 0


def test_static_import_has_no_if_and_tasks_come_from_fused_kernels(policy_onnx: onnx.ModelProto) -> None:
    import tvm
    from tvm import relax
    from tvm.s_tir import meta_schedule as ms

    from rlopt.backends.tvm.importer import import_relax
    from rlopt.backends.tvm.tuning import is_tunable

    target = tvm.target.Target({"kind": "llvm", "num-cores": 1})
    mod, facts = import_relax(policy_onnx, target, {"input0": [1, 1, 32]})
    assert facts["ifs_folded"] == 1
    found_if = []
    relax.analysis.post_order_visit(mod["main"], lambda e: found_if.append(e) if isinstance(e, relax.If) else None)
    assert not found_if
    tunable = [t.task_name for t in ms.relax_integration.extract_tasks(mod, target) if is_tunable(t)]
    assert len(tunable) == 3 and all(name.startswith("fused_matmul") for name in tunable), tunable
    dynamic, _ = import_relax(policy_onnx, target)
    dynamic_if = []
    relax.analysis.post_order_visit(dynamic["main"], lambda e: dynamic_if.append(e) if isinstance(e, relax.If) else None)
    assert dynamic_if, "the dynamic module keeps the branch"


def test_a_kernel_the_flop_estimator_refuses_is_listed_as_untuned(policy_onnx: onnx.ModelProto,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    import tvm
    from tvm.s_tir import analysis

    from rlopt.backends.tvm.build import kernel_split
    from rlopt.backends.tvm.importer import import_relax

    mod, _ = import_relax(policy_onnx, tvm.target.Target({"kind": "llvm", "num-cores": 1}), {"input0": [1, 1, 32]})
    tuned, untuned = kernel_split(mod)
    assert tuned == [] and len(untuned) == 3 and all(k.startswith("fused_matmul") for k in untuned), untuned
    refused = untuned[0]
    estimate = analysis.estimate_tir_flops

    def refusing(module: tvm.IRModule) -> float:
        if module["main"].same_as(mod[refused]):
            raise tvm.error.TVMError("cannot estimate")
        return estimate(module)

    monkeypatch.setattr(analysis, "estimate_tir_flops", refusing)
    assert kernel_split(mod) == ([], untuned), "a kernel without an estimate still ran untuned"


def test_import_prep_drops_dead_nodes_and_pretransposes_gemm_weights_exactly(policy_onnx: onnx.ModelProto) -> None:
    from rlopt.backends.tvm.importer import (drop_dead_nodes, fold_static_ifs, pretranspose_gemm_weights,
                                         tensorize_shape_comparisons)

    single = onnx.ModelProto()
    single.CopyFrom(policy_onnx)
    tensorize_shape_comparisons(single)
    fold_static_ifs(single, {"input0": [1, 1, 32]})
    assert pretranspose_gemm_weights(single) == 3, "the single-observation path's three Linear layers"
    before = len(single.graph.node)
    assert drop_dead_nodes(single.graph) > 0, "the folded If's condition feeds nothing any more"
    assert len(single.graph.node) < before and "Greater" not in {n.op_type for n in single.graph.node}
    assert all(a.i == 0 for n in single.graph.node if n.op_type == "Gemm" for a in n.attribute if a.name == "transB")
    names = {init.name for init in single.graph.initializer}
    assert "fc1.weight__transposed" in names and "fc1.weight" not in names, "the unused original is dropped"
    onnx.checker.check_model(single)
    x = np.random.default_rng(2).standard_normal((1, 1, 32)).astype(np.float32)
    np.testing.assert_array_equal(_ort(single, x), _ort(policy_onnx, x))
    dynamic = onnx.ModelProto()
    dynamic.CopyFrom(policy_onnx)
    assert pretranspose_gemm_weights(dynamic) == 3, "Gemms inside the If's branch are found too"
    assert drop_dead_nodes(dynamic.graph) == 0, "nothing is dead while the If stands"
    for shape in [(1, 1, 32), (3, 2, 32)]:
        x = np.random.default_rng(3).standard_normal(shape).astype(np.float32)
        np.testing.assert_array_equal(_ort(dynamic, x), _ort(policy_onnx, x))


def test_prune_records_keeps_the_fastest_valid_record_per_workload(tmp_path: Path) -> None:
    from rlopt.backends.tvm.database import RECORD_FILE, prune_records

    def line(workload: int, times: list[float] | None, tag: str) -> str:
        return json.dumps([workload, [[tag], times, {"kind": "llvm"}, []]])

    lines = [line(0, [3e-6, 3e-6], "slow"), line(0, [1e-6, 1.2e-6], "fast"), line(0, [1e10], "failed"),
             line(1, [5e-6], "only"), line(2, [1e10], "all failed"), "not json"]
    (tmp_path / RECORD_FILE).write_text("\n".join(lines) + "\n")
    assert prune_records(tmp_path) == (6, 2), "failed runs and an unreadable line go too"
    kept = [json.loads(x) for x in (tmp_path / RECORD_FILE).read_text().splitlines()]
    assert [(w, r[0][0]) for w, r in kept] == [(0, "fast"), (1, "only")]
    assert prune_records(tmp_path) == (2, 2), "pruning a pruned file changes nothing"


def test_shipped_databases_are_pruned() -> None:
    from rlopt.backends.tvm.database import RECORD_FILE

    root = Path(__file__).resolve().parents[1] / "recipes"
    for folder in root.glob("*.tuning/*"):
        workloads = [json.loads(x)[0] for x in (folder / RECORD_FILE).read_text().splitlines() if x.strip()]
        assert workloads and len(workloads) == len(set(workloads)), f"{folder}: one record per workload"


def test_thread_choice_runs_in_process_and_leaves_this_thread_on_every_core(tiny_compiled: Path) -> None:
    import os

    from rlopt.backends.tvm.build import choose_threads

    from rlopt.backends.tvm.params import read_params

    facts = read_manifest(tiny_compiled).networks["policy"].artifacts["tvm"].facts.as_dict()
    libraries = [(b["shapes"], tiny_compiled / b["file"]["path"], b["param_names"]) for b in facts["shape_builds"]]
    weights = read_params(tiny_compiled / facts["params"]["file"]["path"])
    before = os.sched_getaffinity(0)
    bind = os.environ.get("TVM_BIND_THREADS")
    threads, table = choose_threads(libraries, {"input0": "float32"}, 2, weights, budget_s=0.005)
    assert os.sched_getaffinity(0) == before, "re-sizing TVM's pool must not pin the caller to one core"
    assert os.environ.get("TVM_BIND_THREADS") == bind, "the temporary setting is restored"
    assert threads in (1, 2)
    if table:  # only when TVM's pool could start with 2 workers in this process
        assert set(table) == {"1x1x32", "2x3x32", "4x6x32"} and all(set(r) == {"1", "2"} for r in table.values())


# ---------------------------------------------------------------- naming and targets

def test_target_is_completed_for_this_host_and_keys_the_database(tmp_path: Path) -> None:
    from rlopt.backends.tvm.database import database_dir, file_slug, host_cpu, resolve_target, shape_key, target_key

    resolved = resolve_target({"kind": "llvm"})
    assert resolved["mcpu"] == host_cpu() and resolved["num-cores"] >= 1
    assert resolve_target({"kind": "llvm", "mcpu": "skylake-avx512"})["mcpu"] == "skylake-avx512"
    assert target_key({"kind": "llvm", "mcpu": "znver4", "num-cores": 16}) == "llvm-znver4"
    recipe = tmp_path / "my_recipe.yaml"
    assert database_dir(recipe, {"kind": "llvm", "mcpu": "znver4"}) == tmp_path / "my_recipe.tuning" / "llvm-znver4"
    assert shape_key({"obs": [1, 17], "h": [1, 4]}) == "obs=1x17,h=1x4"
    assert file_slug({"obs": [1, 17], "h": [1, 4]}) == "1x17_1x4"


def test_profile_shapes_are_distinct_points(tmp_path: Path) -> None:
    from rlopt.backends.tvm.database import profile_shapes

    recipe = load_recipe(write_tiny_recipe(tmp_path))
    assert [points for points, _ in profile_shapes(recipe.networks["policy"])] == [["min"], ["opt"], ["max"]]
    static = load_recipe(_static_recipe(tmp_path))
    assert profile_shapes(static.networks["policy"]) == [(["min", "opt", "max"], {"input0": [2, 3, 32]})]


def test_missing_cpu_features_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt import backends
    from rlopt.backends.tvm import cpu_features

    monkeypatch.setattr(cpu_features, "host_flags", lambda: {"sse41", "avx2", "pni", "bmi1"})
    assert cpu_features.missing_features(["sse4.1", "avx2", "sse3", "bmi"]) == []
    assert cpu_features.missing_features(["avx2", "avx512f"]) == ["avx512f"]
    reason = backends.unavailable_reason("tvm", {"target": {"kind": "llvm", "mcpu": "znver4"},
                                                 "cpu_features": ["avx2", "avx512f"]})
    assert reason is not None and "znver4" in reason and "avx512f" in reason


def test_unreadable_database_is_one_located_error(tmp_path: Path) -> None:
    from rlopt.errors import StageError
    from rlopt.backends.tvm.database import open_database

    assert open_database(tmp_path / "absent", create=False) is None
    (tmp_path / "database_workload.json").write_text("not json\n")
    (tmp_path / "database_tuning_record.json").write_text("[0, 1]\n")
    with pytest.raises(StageError) as info:
        open_database(tmp_path, create=False)
    assert "database_workload.json" in str(info.value) and "rlopt tune" in str(info.value)
    assert "\n" not in str(info.value)


# ---------------------------------------------------------------- compile and runtime (untuned database)

def test_the_tvm_stage_line_names_the_recipe_compiled_now() -> None:
    from types import SimpleNamespace

    from rlopt.backends.tvm.facts import TvmFacts
    from rlopt.backends.tvm.stages import TvmBuild
    from rlopt.stages.base import StageOutput

    out = StageOutput(Path("net/tvm"), TvmFacts(tuning_summary="tuned 0/1 shapes; no record for min 1x4: run "
                                                               "'rlopt tune RECIPE'"))
    line = TvmBuild.detail(None, SimpleNamespace(recipe_path=Path("/here/recipe.yaml")), out)  # type: ignore
    assert line == "tvm (tuned 0/1 shapes; no record for min 1x4: run 'rlopt tune /here/recipe.yaml')"


def test_compile_builds_a_static_library_per_shape_and_records_every_file(tiny_compiled: Path) -> None:
    tvm_record = read_manifest(tiny_compiled).networks["policy"].artifacts["tvm"]
    facts = tvm_record.facts.as_dict()
    assert facts["target"]["kind"] == "llvm" and facts["target"]["mcpu"] and facts["target"]["num-cores"] >= 1
    builds = facts["shape_builds"]
    assert [b["points"] for b in builds] == [["min"], ["opt"], ["max"]]
    for build in builds:
        path = tiny_compiled / build["file"]["path"]
        assert path.is_file() and path.stat().st_size == build["file"]["bytes"]
        assert build["ifs_folded"] == 1
    assert facts["database"]["found"] is False and facts["tuned"] is False
    assert all(b["untuned_kernels"] for b in builds), "no database: every arithmetic kernel is listed as untuned"
    assert "no record for" in facts["tuning_summary"] and "run 'rlopt tune RECIPE'" in facts["tuning_summary"]
    assert str(tiny_compiled.parent) not in facts["tuning_summary"], "a cached build serves recipes at other paths"
    assert facts["variant_parity"]["dynamic"]["passed"] is True
    assert facts["num_threads"] >= 1 and facts["thread_latency_us"] == {}, "untuned kernels are serial: not timed"


def test_session_dispatches_by_exact_shape_and_falls_back_to_dynamic(tiny_compiled: Path) -> None:
    import onnxruntime as ort

    session = rlopt.load(tiny_compiled, "policy", backend="tvm")
    runner = session._gen.runners["tvm"]
    assert sorted(runner.shape_buckets) == [((1, 1, 32),), ((2, 3, 32),), ((4, 6, 32),)]
    reference = ort.InferenceSession(str(tiny_compiled / "policy" / "model.onnx"), providers=["CPUExecutionProvider"])
    rng = np.random.default_rng(5)
    for shape in [(1, 1, 32), (2, 3, 32), (4, 6, 32), (3, 2, 32), (1, 4, 32)]:
        x = rng.standard_normal(shape).astype(np.float32)
        expected = reference.run(None, {"input0": x})[0]
        np.testing.assert_allclose(session.run({"input0": x})["logits"], expected, atol=1e-5, rtol=1e-4)
        np.testing.assert_allclose(runner.infer_dynamic({"input0": x})[0], expected, atol=1e-5, rtol=1e-4)


def test_unaligned_inputs_are_staged_and_outputs_never_alias(tiny_compiled: Path) -> None:
    session = rlopt.load(tiny_compiled, "policy", backend="tvm")
    rng = np.random.default_rng(6)
    x = rng.standard_normal((2, 3, 32)).astype(np.float32)
    backing = np.empty(x.size + 1, dtype=np.float32)
    unaligned = backing[1:].reshape(x.shape)  # 4 bytes past an aligned start: never 64-byte aligned
    unaligned[...] = x
    assert unaligned.ctypes.data % 64 != 0
    first = session.run({"input0": x})["logits"]
    kept = first.copy()
    np.testing.assert_array_equal(session.run({"input0": unaligned})["logits"], first)
    session.run({"input0": rng.standard_normal((2, 3, 32)).astype(np.float32)})
    np.testing.assert_array_equal(first, kept)  # a later call did not overwrite an earlier result


def test_sessions_in_threads_agree(tiny_compiled: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    session = rlopt.load(tiny_compiled, "value", backend="tvm")
    inputs = [np.random.default_rng(i).standard_normal((4, 6, 32)).astype(np.float32) for i in range(8)]
    expected = [session.run({"input0": x})["value"] for x in inputs]
    with ThreadPoolExecutor(4) as pool:
        for _ in range(5):
            got = list(pool.map(lambda x: session.run({"input0": x})["value"], inputs))
            for a, b in zip(got, expected):
                np.testing.assert_array_equal(a, b)


def test_corrupt_shape_library_is_refused_before_loading(tiny_copy: Path) -> None:
    build = read_manifest(tiny_copy).networks["policy"].artifacts["tvm"].facts.as_dict()["shape_builds"][1]
    path = tiny_copy / build["file"]["path"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match=r"tvm-llvm-2x3x32\.so: sha256: does not match"):
        rlopt.load(tiny_copy, "policy", backend="tvm")
    proc = run_rlopt("verify", str(tiny_copy))
    assert proc.returncode == 1 and "2x3x32" in proc.stderr, proc.stderr


# ---------------------------------------------------------------- CLI usage errors (no tuning)

@pytest.mark.parametrize(("args", "needles"), [
    (["--trials", "0"], ["--trials 0", "must be >= 1"]),
    (["--time-budget", "-1"], ["--time-budget", "> 0"]),
    (["--rpc-tracker", "localhost"], ["HOST:PORT", "fix:"]),
    (["--rpc-tracker", "127.0.0.1:9190"], ["--rpc-key", "fix:"]),
    (["--network", "nope"], ["networks", "no network 'nope'", "fix:"]),
])
def test_tune_usage_errors_are_one_line(tmp_path: Path, args: list[str], needles: list[str]) -> None:
    recipe = write_tiny_recipe(tmp_path)
    assert_one_line_error(run_rlopt("tune", str(recipe), *args), 2, *needles)


def test_tune_rejects_a_non_llvm_target(tmp_path: Path) -> None:
    recipe = write_tiny_recipe(tmp_path, extra="tvm: {target: {kind: cuda, arch: sm_86}}\n")
    from rlopt.tools.tune import tune_recipe

    with pytest.raises(UsageError, match="tvm.target"):
        tune_recipe(recipe, trials=1)


# ---------------------------------------------------------------- how a tune ends (MetaSchedule's loop faked)

def _tune_ending_with(monkeypatch: pytest.MonkeyPatch, after_the_budget: Any) -> None:
    """MetaSchedule's tune_tasks replaced by one that calls rlopt's measure callback through TVM's FFI once (the
    budget is spent: it raises) and hands what came back to `after_the_budget`; no worker process starts."""
    from tvm.s_tir import meta_schedule as ms

    from rlopt.backends.tvm import tuning

    monkeypatch.setattr(tuning, "make_builder", lambda cores, artifacts: None)
    monkeypatch.setattr(tuning, "make_runner", lambda rpc: None)
    # pytest leaves its nameless capture handlers on MetaSchedule's logger after a first tune in this process, and
    # MetaSchedule's logging set-up formats every handler's name
    logger = logging.getLogger("tvm.s_tir.meta_schedule")
    monkeypatch.setattr(logger, "handlers", [h for h in logger.handlers if h.get_name()])

    def tune_tasks(*, measure_callbacks: list[Any], **_: Any) -> None:
        try:
            measure_callbacks[-1].apply(ms.task_scheduler.create("round-robin"), 0, [], [], [])
        except Exception as exc:  # noqa: BLE001 - what the FFI made of BudgetSpent
            after_the_budget(exc)
        raise AssertionError("the measure callback did not stop tuning")

    monkeypatch.setattr(ms.tune, "tune_tasks", tune_tasks)


def test_a_spent_budget_ends_tuning_cleanly(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.tools.tune import tune_recipe

    def unwind(exc: Exception) -> None:
        assert isinstance(exc, RuntimeError), "BudgetSpent comes back through the FFI as a RuntimeError"
        raise exc

    _tune_ending_with(monkeypatch, unwind)
    result = tune_recipe(_static_recipe(tmp_path), trials=2, time_budget_s=1e-9)
    assert result.stopped_by_budget is True


def test_an_error_after_the_budget_is_spent_is_not_swallowed(tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """Once the budget was spent, every error out of MetaSchedule used to pass for the budget's own stop."""
    from rlopt.tools.tune import tune_recipe

    def crash(exc: Exception) -> None:
        raise RuntimeError("the builder crashed")

    _tune_ending_with(monkeypatch, crash)
    with pytest.raises(RuntimeError, match="the builder crashed"):
        tune_recipe(_static_recipe(tmp_path), trials=2, time_budget_s=1e-9)


# ---------------------------------------------------------------- real MetaSchedule runs (slow)

@pytest.mark.slow
def test_tune_then_compile_applies_the_database_and_resumes(tmp_path: Path) -> None:
    from rlopt.compile import compile_recipe
    from rlopt.backends.tvm.database import database_dir, read_meta, resolve_target

    recipe = _static_recipe(tmp_path)
    proc = run_rlopt("tune", str(recipe), "--trials", "2", "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr
    summary = json.loads(proc.stdout)
    assert len(summary["tuned"]) == 3 and all(t["trials"] >= 1 for t in summary["tuned"]), summary
    directory = database_dir(recipe, resolve_target({"kind": "llvm"}))
    assert Path(summary["database"]) == directory
    assert (directory / "database_tuning_record.json").stat().st_size > 0
    meta = read_meta(directory)
    assert meta["workloads"]["policy[input0=2x3x32]"]["trials"] == 2 and meta["target"]["mcpu"]

    records = (directory / "database_tuning_record.json").read_bytes()
    again = run_rlopt("tune", str(recipe), "--trials", "2", "--json", timeout=600)
    assert again.returncode == 0, again.stderr
    resumed = json.loads(again.stdout)
    assert resumed["tuned"] == [] and len(resumed["already_tuned"]) == 3, "nothing is tuned twice"
    assert (directory / "database_tuning_record.json").read_bytes() == records, "and nothing is measured again"

    result = compile_recipe(recipe, tmp_path / "out")
    assert result.passed, result.failures
    facts = result.manifest.networks["policy"].artifacts["tvm"].facts.as_dict()
    (build,) = facts["shape_builds"]
    assert facts["tuned"] is True and len(build["tuned_kernels"]) == 3 and build["untuned_kernels"] == []
    assert facts["tuning_summary"] == "tuned 1/1 shapes"
    from rlopt.backends.tvm.database import host_cores

    if host_cores() > 1:
        assert set(facts["thread_latency_us"]["2x3x32"]) == {"1", str(host_cores())}, "tuned: timed per count"
    out = rlopt.load(tmp_path / "out", "policy", backend="tvm").run({"input0": np.ones((2, 3, 32), np.float32)})
    assert out["logits"].shape == (2, 3, 5)


@pytest.mark.slow
def test_compile_with_tune_trials_tunes_then_builds(tmp_path: Path) -> None:
    recipe = _static_recipe(tmp_path)
    proc = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "out"), "--tune-trials", "2", "--json",
                     timeout=600)
    assert proc.returncode == 0, proc.stderr
    facts = json.loads(proc.stdout)["manifest"]["networks"]["policy"]["artifacts"]["tvm"]["facts"]
    assert facts["tuned"] is True and facts["database"]["found"] is True
    assert (tmp_path / "static.tuning" / facts["database"]["target_key"] / "meta.json").is_file()


@pytest.mark.slow
def test_time_budget_stops_and_marks_the_workload_partial(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import tempfile

    import psutil

    from rlopt.backends.tvm.database import read_meta
    from rlopt.tools.tune import tune_recipe

    recipe = _static_recipe(tmp_path)
    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setenv("TMPDIR", str(temp))
    monkeypatch.setattr(tempfile, "tempdir", None)
    result = tune_recipe(recipe, trials=64, time_budget_s=0.5)
    assert result.stopped_by_budget is True
    assert sum(t.done for t in result.tasks) < 64 * len(result.tasks)
    assert read_meta(result.database)["workloads"]["policy[input0=2x3x32]"]["partial"] is True
    assert list(temp.iterdir()) == [], "no candidate library is left in the temp folder"
    workers = [p for p in psutil.Process().children(recursive=True) if "popen_worker" in " ".join(p.cmdline())]
    assert psutil.wait_procs(workers, timeout=10)[1] == [], "no MetaSchedule worker outlives the tune"


@pytest.mark.slow
def test_ctrl_c_stops_tuning_cleanly_and_keeps_the_records(tmp_path: Path) -> None:
    import os
    import signal

    from rlopt.backends.tvm.database import RECORD_FILE, read_meta

    recipe = _static_recipe(tmp_path)
    records = tmp_path / "static.tuning"
    proc = subprocess.Popen([sys.executable, "-m", "rlopt", "tune", str(recipe), "--trials", "512"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=dict(os.environ, COLUMNS="200"))
    try:
        deadline = time.monotonic() + 240
        while not any(f.stat().st_size for f in records.glob(f"*/{RECORD_FILE}")):  # first batch measured
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.5)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-2000:]
    assert "Traceback" not in err and "Segmentation" not in err
    assert "tuning interrupted" in err.strip().splitlines()[-1]
    (database,) = records.glob("*")
    assert read_meta(database)["workloads"]["policy[input0=2x3x32]"]["partial"] is True
    assert (database / RECORD_FILE).read_text().strip(), "the records measured before Ctrl-C are kept"


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"process exited with {proc.returncode}")
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.2)
    raise TimeoutError(f"nothing listens on 127.0.0.1:{port}")


@pytest.mark.slow
def test_tune_through_a_real_rpc_tracker_and_server(tmp_path: Path) -> None:
    from rlopt.backends.tvm.database import read_meta

    tracker_port, server_port, key = _free_port(), _free_port(), "rlopt-test"
    tracker = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                "--port", str(tracker_port), "--port-end", str(tracker_port + 1)],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    server = None
    try:
        _wait_for_port(tracker_port, tracker)
        server = subprocess.Popen([sys.executable, "-m", "tvm.exec.rpc_server", "--tracker",
                                   f"127.0.0.1:{tracker_port}", "--key", key, "--host", "127.0.0.1",
                                   "--port", str(server_port), "--port-end", str(server_port + 1)],
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        _wait_for_port(server_port, server)
        recipe = _static_recipe(tmp_path)
        proc = run_rlopt("tune", str(recipe), "--trials", "2", "--rpc-tracker", f"127.0.0.1:{tracker_port}",
                         "--rpc-key", key, "--json", timeout=600)
        assert proc.returncode == 0, proc.stderr
        summary = json.loads(proc.stdout)
        measured = [t for t in summary["tuned"] if t["best_us"] is not None]
        assert measured, f"no candidate ran on the RPC server: {summary}"
        assert read_meta(Path(summary["database"]))["workloads"]
    finally:
        left = [p for process in (server, tracker) if process is not None for p in _stop_tree(process)]
    assert left == [], "the tracker's and server's popen workers are stopped with them"


def _stop_tree(process: subprocess.Popen[bytes]) -> list[int]:
    """Stop `process` and its descendants: `python -m tvm.exec.rpc_tracker` / `rpc_server` serve from a
    `tvm.exec.popen_worker` child that SIGTERM to the parent leaves running for good. Returns the pids that
    outlived SIGTERM and SIGKILL (none, normally)."""
    import psutil

    try:
        family = [psutil.Process(process.pid), *psutil.Process(process.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        family = []
    for member in family:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.terminate()
    _, alive = psutil.wait_procs(family, timeout=10)
    for member in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            member.kill()
    process.wait()
    return [p.pid for p in psutil.wait_procs(alive, timeout=10)[1]]


@pytest.mark.slow
def test_shipped_databases_tune_the_bundled_recipes(tmp_path: Path) -> None:
    """The committed databases cover every workload of the bundled recipes on this CPU (by name, or tuned on a CPU
    with the same vector features), or say why not."""
    from rlopt.backends.tvm.database import choose_database, read_meta, resolve_target

    root = Path(__file__).resolve().parents[1] / "recipes"
    target = resolve_target({"kind": "llvm"})
    choices = {p: choose_database(p, target) for p in sorted(root.glob("*.yaml"))}
    shipped = {p: c for p, c in choices.items() if c.found}
    if not shipped:
        pytest.skip(f"no shipped database applies to {target['mcpu']}: "
                    + "; ".join(c.reason for c in choices.values()))
    for recipe, choice in shipped.items():
        meta = read_meta(choice.directory)
        assert meta["workloads"], recipe
    shutil.copytree(root, tmp_path / "recipes")
    from rlopt.compile import compile_recipe

    result = compile_recipe(tmp_path / "recipes" / "policy_value_heads.yaml", tmp_path / "out",
                            backends=["onnxruntime", "tvm"])
    assert result.passed, result.failures
    for network in result.manifest.networks.values():
        assert network.artifacts["tvm"].facts.as_dict()["tuned"] is True
