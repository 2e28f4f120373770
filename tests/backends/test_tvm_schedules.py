"""Schedule rules for kernels without a tuning record: which kernels each rule takes (and refuses), that the result
computes what ONNX Runtime does, and what the manifest records.

Small shapes only: each kernel is imported from a tiny ONNX graph, scheduled and compiled in well under a second.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import onnx
import pytest
import torch
from torch import nn

from rlopt.manifest import read_manifest

tvm = pytest.importorskip("tvm")


@pytest.fixture(scope="module")
def target() -> Any:
    from rlopt.backends.tvm.database import resolve_target

    return tvm.target.Target(resolve_target({"kind": "llvm"}))


def _onnx(module: nn.Module, example: torch.Tensor, folder: Path, name: str) -> onnx.ModelProto:
    path = folder / f"{name}.onnx"
    torch.onnx.export(module.eval(), (example,), str(path), input_names=["x"], output_names=["y"],
                      dynamic_axes={"x": {0: "batch"}}, dynamo=False)
    return onnx.load(str(path))


class Mlp(nn.Module):
    def __init__(self, obs: int, hidden: int, act: type[nn.Module], out: int, layer_norm: bool = False) -> None:
        super().__init__()
        norm = [nn.LayerNorm(hidden)] if layer_norm else []
        self.net = nn.Sequential(nn.Linear(obs, hidden), *norm, act(), nn.Linear(hidden, hidden), act(),
                                 nn.Linear(hidden, out))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class SmallCnn(nn.Module):
    """NatureCNN's three kinds of convolution (8x8/4, 4x4/2, 3x3/1), one with padding, shrunk."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(2, 8, 8, stride=4), nn.ReLU(), nn.Conv2d(8, 16, 4, stride=2), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, stride=1, padding=1), nn.Tanh(), nn.Flatten(),
                                  nn.Linear(16 * 3 * 3, 5))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


class Softmax(nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(x * 2.0, dim=-1)


@pytest.fixture(scope="module")
def graphs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, onnx.ModelProto]:
    torch.manual_seed(0)
    folder = tmp_path_factory.mktemp("schedule-graphs")
    return {
        "mlp_relu": _onnx(Mlp(17, 64, nn.ReLU, 6), torch.randn(1, 17), folder, "mlp_relu"),
        "mlp_ln_silu": _onnx(Mlp(24, 48, nn.SiLU, 1, layer_norm=True), torch.randn(1, 24), folder, "mlp_ln_silu"),
        "mlp_tanh_3d": _onnx(Mlp(8, 32, nn.Tanh, 3), torch.randn(2, 3, 8), folder, "mlp_tanh_3d"),
        "cnn": _onnx(SmallCnn(), torch.randn(1, 2, 36, 36), folder, "cnn"),
        "softmax": _onnx(Softmax(), torch.randn(1, 40), folder, "softmax"),
    }


def _build(model: onnx.ModelProto, shape: list[int], target: Any, rules: bool) -> tuple[Any, dict[str, Any], Any]:
    """(a callable running the static library on one input, its import facts, the rules' report)."""
    from rlopt.backends.tvm.importer import fold_weight_layouts, import_relax
    from rlopt.backends.tvm.params import bind_params
    from rlopt.backends.tvm.schedules import RuleReport, apply_rules

    mod, facts = import_relax(model, target, {"x": shape}, weights_as_params=True)
    report = RuleReport()
    if rules:
        mod, report = apply_rules(mod, target)
    mod = fold_weight_layouts(mod, weights_as_params=True)
    vm = tvm.relax.VirtualMachine(tvm.compile(mod, target), tvm.cpu())
    weights = bind_params(tvm, vm, list(facts["params"]), facts["params"], tvm.cpu())

    def run(x: np.ndarray) -> np.ndarray:
        return np.asarray(vm["main"](tvm.runtime.tensor(x), *weights).numpy())

    return run, facts, report


def _onnxruntime(model: onnx.ModelProto, x: np.ndarray) -> np.ndarray:
    import onnxruntime as ort

    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return np.asarray(session.run(None, {"x": x})[0])


@pytest.mark.parametrize(("graph", "shape", "expected"), [
    ("mlp_relu", [1, 17], {"dense": 3}),
    ("mlp_relu", [5, 17], {"dense": 3}),       # a batch no tile height divides evenly but 1 and 5
    ("mlp_relu", [96, 17], {"dense": 3}),      # big enough for parallel tiles
    ("mlp_ln_silu", [7, 24], {"dense": 3, "rows": 1}),
    ("mlp_tanh_3d", [2, 3, 8], {"dense": 3}),  # rows from two dims, fused
    ("cnn", [3, 2, 36, 36], {"conv": 3, "dense": 1}),
    ("softmax", [4, 40], {"rows": 1}),
])
def test_rules_schedule_each_kernel_and_match_onnxruntime(graphs: dict[str, onnx.ModelProto], target: Any,
                                                         graph: str, shape: list[int],
                                                         expected: dict[str, int]) -> None:
    run, _, report = _build(graphs[graph], shape, target, rules=True)
    used: dict[str, int] = {}
    for rule in report.scheduled.values():
        used[rule] = used.get(rule, 0) + 1
    assert {rule: used.get(rule, 0) for rule in expected} == expected, (report.scheduled, report.refused)
    x = np.random.default_rng(1).standard_normal(shape).astype(np.float32)
    np.testing.assert_allclose(run(x), _onnxruntime(graphs[graph], x), atol=2e-5, rtol=1e-4)


def test_big_tiles_go_to_the_thread_pool_and_small_ones_do_not(graphs: dict[str, onnx.ModelProto],
                                                             target: Any) -> None:
    from rlopt.backends.tvm.importer import import_relax
    from rlopt.backends.tvm.schedules import apply_rules

    small, _ = import_relax(graphs["mlp_relu"], target, {"x": [4, 17]}, weights_as_params=True)
    big, _ = import_relax(graphs["mlp_relu"], target, {"x": [2048, 17]}, weights_as_params=True)
    assert apply_rules(small, target)[1].parallel == []
    parallel = apply_rules(big, target)[1].parallel
    assert parallel and all("matmul" in name for name in parallel), parallel  # 2048x64x64: 8M multiply-adds


def test_a_kernel_no_rule_takes_keeps_the_default_loops_and_says_why(target: Any) -> None:
    from tvm.script import tirx as T

    from rlopt.backends.tvm.schedules import apply_rules

    @T.prim_func(private=True, s_tir=True)
    def two_outputs_of_ints(a: T.Buffer((T.int64(8), T.int64(8)), "int32"), b: T.Buffer((T.int64(8),), "int32"),
                            c: T.Buffer((T.int64(8),), "int32")) -> None:
        for i, k in T.grid(T.int64(8), T.int64(8)):
            with T.sblock("rowsum"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    b[vi] = 0
                b[vi] = b[vi] + a[vi, vk]
        for i, k in T.grid(T.int64(8), T.int64(8)):
            with T.sblock("rowmax"):
                vi, vk = T.axis.remap("SR", [i, k])
                with T.init():
                    c[vi] = 0
                c[vi] = T.max(c[vi], a[vi, vk])

    mod = tvm.IRModule({"kernel": two_outputs_of_ints})
    out, report = apply_rules(mod, target)
    assert report.scheduled == {} and "kernel" in report.refused
    reasons = report.refused["kernel"]
    assert "dense: 2 reduction blocks" in reasons and "rows: the output block is a reduction" in reasons, reasons
    assert out["kernel"].same_as(two_outputs_of_ints), "refused: the kernel is left exactly as it was"


def test_a_rule_that_fails_inside_tvm_falls_back_to_the_next(graphs: dict[str, onnx.ModelProto],
                                                            target: Any) -> None:
    from rlopt.backends.tvm.importer import import_relax
    from rlopt.backends.tvm.schedules import RULES, apply_rules

    def broken(func: Any, unit: Any) -> Any:
        sch = tvm.s_tir.Schedule(func)
        sch.compute_inline(sch.get_child_blocks(sch.get_sblock("root"))[0])  # a reduction: TVM refuses
        return sch

    mod, _ = import_relax(graphs["mlp_relu"], target, {"x": [3, 17]}, weights_as_params=True)
    _, report = apply_rules(mod, target, rules=[("broken", broken), *RULES])
    assert set(report.scheduled.values()) == {"dense"}, report.scheduled
    assert all("broken: ScheduleError" in reason for reason in report.refused.values())


def test_tuned_kernels_are_left_to_their_records(graphs: dict[str, onnx.ModelProto], target: Any) -> None:
    from rlopt.backends.tvm.importer import import_relax
    from rlopt.backends.tvm.schedules import apply_rules

    mod, _ = import_relax(graphs["mlp_relu"], target, {"x": [3, 17]}, weights_as_params=True)
    name = next(gv for gv in mod.get_global_vars() if gv.name_hint.startswith("fused_matmul_add"))
    mod[name] = mod[name].with_attr("tirx.is_scheduled", True)  # what a tuning record leaves
    _, report = apply_rules(mod, target)
    assert name.name_hint not in report.scheduled and len(report.scheduled) == 2


def test_sigmoid_lowers_through_fast_tanh(graphs: dict[str, onnx.ModelProto], target: Any) -> None:
    from rlopt.backends.tvm.importer import import_relax

    mod, _ = import_relax(graphs["mlp_ln_silu"], target, {"x": [2, 24]}, weights_as_params=True)
    names = [gv.name_hint for gv in mod.get_global_vars()]
    assert any("fast_sigmoid" in n for n in names) and not any("tir_sigmoid" in n for n in names), names
    values = np.linspace(-30, 30, 4001, dtype=np.float32)
    from rlopt.backends.tvm.fast_sigmoid import _fast_sigmoid

    x = tvm.te.placeholder((values.size,), "float32", name="x")
    kernel = tvm.tirx.build(tvm.te.create_prim_func([x, _fast_sigmoid(x)]).with_attr("global_symbol", "main"),
                            target=target)
    out = tvm.runtime.tensor(np.zeros_like(values))
    kernel["main"](tvm.runtime.tensor(values), out)
    np.testing.assert_allclose(out.numpy(), torch.sigmoid(torch.from_numpy(values)).numpy(), atol=2e-7)


def test_vector_unit_follows_the_targets_features() -> None:
    from rlopt.backends.tvm.schedules.target import vector_unit

    def unit(mcpu: str) -> tuple[int, int]:
        found = vector_unit(tvm.target.Target({"kind": "llvm", "mcpu": mcpu}))
        return found.lanes, found.registers

    assert unit("skylake-avx512") == (16, 32)
    assert unit("haswell") == (8, 16) and unit("znver2") == (8, 16)


@pytest.mark.parametrize("m", [1, 5, 17, 64, 97, 256, None])
@pytest.mark.parametrize("n", [1, 6, 24, 64, 300, 512])
def test_gemm_tiles_divide_the_extents_and_fit_the_registers(m: int | None, n: int) -> None:
    from rlopt.backends.tvm.schedules.gemm import gemm_tile
    from rlopt.backends.tvm.schedules.target import VectorUnit

    for unit in (VectorUnit(16, 32, "avx512"), VectorUnit(8, 16, "avx2")):
        tile = gemm_tile(m, n, unit)
        assert n % tile.width == 0 and tile.width % tile.lanes == 0
        assert m is None and tile.rows == 1 or m is not None and m % tile.rows == 0
        assert tile.rows * tile.vectors * -(-tile.lanes // unit.lanes) <= unit.accumulators
    assert gemm_tile(256, 256, VectorUnit(16, 32, "avx512")).rows * 16 >= 64, "a big GEMM gets a real tile"


# ---------------------------------------------------------------- the build and the manifest

def test_compile_records_which_rule_scheduled_each_kernel(tiny_compiled: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"].artifacts["tvm"]
    assert record.verified
    facts = record.facts
    assert facts.rule_kernels, "the dynamic library's kernels are scheduled too"
    assert set(facts.rule_kernels.values()) <= {"dense", "conv", "rows", "elementwise"}
    for build in facts.shape_builds:
        assert build.untuned_kernels and build.tuned_kernels == [] and build.default_kernels == []
        assert set(build.untuned_kernels) <= set(build.rule_kernels)
        assert set(build.rule_kernels.values()) <= {"dense", "conv", "rows", "elementwise"}
    assert facts.tuning_summary and "rules scheduled" in facts.tuning_summary


def test_schedule_rules_false_leaves_every_kernel_to_tvm(graphs: dict[str, onnx.ModelProto], target: Any) -> None:
    from rlopt.backends.tvm.build import _scheduled_by_rules
    from rlopt.backends.tvm.config import TvmConfig
    from rlopt.backends.tvm.importer import import_relax

    mod, _ = import_relax(graphs["mlp_relu"], target, {"x": [64, 17]}, weights_as_params=True)
    off, rules, parallel = _scheduled_by_rules(mod, target, TvmConfig(schedule_rules=False))
    assert off.same_as(mod) and rules == {} and parallel == []
    on, rules, _ = _scheduled_by_rules(mod, target, TvmConfig())
    assert set(rules.values()) == {"dense"} and len(rules) == 3
