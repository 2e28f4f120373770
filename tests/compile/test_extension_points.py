"""Extension points: where the model comes from, checks after export, multi-step verification, tune's front end."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlopt.compile.frontend import (
    FRONTEND,
    FRONTEND_TO_PADDING,
    ExportOnnx,
    FactorySource,
    PadGemm,
    PadGemmForTuning,
    SpecializationGuard,
    graph_and_weights,
)
from rlopt.compile.measure import MultiStep, SingleStep
from rlopt.compile.stage import Context
from rlopt.errors import StageError
from rlopt.parity import Tolerance
from rlopt.recipe import load_recipe
from rlopt.reference import Reference
from tests.conftest import write_tiny_recipe


def test_the_front_end_lists_checks_after_export_and_tune_runs_the_same_up_to_padding() -> None:
    assert FRONTEND.index(SpecializationGuard) == FRONTEND.index(ExportOnnx) + 1
    assert FRONTEND[-1] is PadGemm and FRONTEND_TO_PADDING[-1] is PadGemmForTuning
    assert [s for s in FRONTEND_TO_PADDING if s is not PadGemmForTuning] == \
        [s for s in FRONTEND if s in FRONTEND_TO_PADDING]


def test_graph_and_weights_are_keyed_apart() -> None:
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    first = torch.jit.script(torch.nn.Linear(4, 3))
    second = torch.jit.script(torch.nn.Linear(4, 3))
    a, b = graph_and_weights(first), graph_and_weights(second)
    assert a["graph_sha256"] == b["graph_sha256"] and a["weights_sha256"] != b["weights_sha256"]


def _context(tmp_path: Path, extra: str = "") -> Context:
    recipe_path = write_tiny_recipe(tmp_path, backends="[onnxruntime, tvm]", extra=extra)
    recipe = load_recipe(recipe_path)
    ctx = Context(recipe, recipe_path, "policy", recipe.networks["policy"], tmp_path / "staging")
    ctx.dir.mkdir(parents=True)
    return ctx


def _onnx_with_input(path: Path, dims: list[Any]) -> Path:
    onnx = pytest.importorskip("onnx")
    helper = onnx.helper
    node = helper.make_node("Identity", ["input0"], ["logits"])
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("input0", onnx.TensorProto.FLOAT, dims)],
                              [helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, dims)])
    onnx.save(helper.make_model(graph), str(path))
    return path


def test_the_specialization_guard_refuses_a_dynamic_dim_the_export_fixed(tmp_path: Path) -> None:
    ctx = _context(tmp_path)
    ctx.artifacts["model.onnx"] = _onnx_with_input(tmp_path / "ok.onnx", ["batch", "input0_d1", 32])
    assert SpecializationGuard().run(ctx).facts == {"inputs_checked": 1}
    ctx.artifacts["model.onnx"] = _onnx_with_input(tmp_path / "fixed.onnx", ["batch", 3, 32])
    with pytest.raises(StageError, match=r"networks.policy.inputs.input0.*dim 1 varies in the recipe"):
        SpecializationGuard().run(ctx)
    ctx.artifacts["model.onnx"] = _onnx_with_input(tmp_path / "wrong.onnx", ["batch", "t", 16])
    with pytest.raises(StageError, match="dim 2 is 16 in the export, 32 in the recipe"):
        SpecializationGuard().run(ctx)


def _reference() -> Reference:
    arrays = {"opt:in:obs": np.ones((2, 1, 3), np.float32), "opt:in:h": np.zeros((2, 1, 2), np.float32),
              "opt:out:out": np.ones((2, 1, 3), np.float32), "opt:out:h_new": np.ones((2, 1, 2), np.float32)}
    return Reference(arrays, ["obs", "h"], ["out", "h_new"])


def _recurrent(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """out = obs + h[0], h_new = h + 1: the state matters from the second step on."""
    return [feeds["obs"] + feeds["h"][..., :1], feeds["h"] + 1]


def test_multi_step_verification_feeds_the_compiled_state_back() -> None:
    tol = Tolerance(1e-6, 0.0, 1.0)
    passed = MultiStep(steps=3, state={"h": "h_new"}, reference_step=_recurrent).check(
        _recurrent, _reference(), "generic", "categorical", tol)
    assert passed.passed and passed.compared == 2 * 3

    def stateless(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return [feeds["obs"] + 0, np.ones_like(feeds["h"])]  # ignores its state: right at step 1 only

    failed = MultiStep(steps=3, state={"h": "h_new"}, reference_step=_recurrent).check(
        stateless, _reference(), "generic", "categorical", tol)
    assert not failed.passed
    single = SingleStep().check(stateless, _reference(), "generic", "categorical", tol)
    assert single.passed, "one step cannot see the state bug"


class CountingSource:
    """A model source other than the recipe's factory (an SB3 zip source comes next)."""

    def __init__(self, inner: FactorySource) -> None:
        self.inner, self.loads = inner, 0

    def load(self) -> tuple[Any, dict[str, Any]]:
        self.loads += 1
        return self.inner.load()


def test_compile_takes_its_model_from_a_model_source(tmp_path: Path) -> None:
    from rlopt.compile import compile_recipe
    from rlopt.compile.cache import StageCache

    recipe_path = write_tiny_recipe(tmp_path, backends="[onnxruntime]")
    source = CountingSource(FactorySource(load_recipe(recipe_path), recipe_path))
    result = compile_recipe(recipe_path, tmp_path / "out", source=source, cache=StageCache(enabled=False))
    assert result.passed and source.loads == 1
    stages = [s["stage"] for s in result.manifest.networks["policy"].stages]
    assert stages[:4] == ["script", "reference", "onnx", "specialization guard"]
    script = result.manifest.networks["policy"].stages[0]
    assert script["status"] == "ok"


def test_tune_feeds_tvm_the_graph_compile_builds_pad_gemm_outputs_included(tmp_path: Path) -> None:
    pytest.importorskip("onnx")
    from rlopt.compile.frontend import model_source
    from rlopt.tools.tune import network_onnx

    shapes: dict[bool, list[Any]] = {}
    for pad_outputs in (False, True):
        folder = tmp_path / str(pad_outputs)
        folder.mkdir()
        recipe_path = write_tiny_recipe(folder, extra=f"pad_gemm: 64\npad_gemm_outputs: {str(pad_outputs).lower()}\n")
        recipe = load_recipe(recipe_path)
        model, _ = model_source(recipe, recipe_path).load()
        work = folder / "work"
        work.mkdir()
        graph = network_onnx(recipe, recipe_path, model, "policy", work).graph
        assert (work / "policy" / "model.padded.onnx").is_file(), "tvm gets the padded model when pad_gemm is on"
        shapes[pad_outputs] = sorted(tuple(i.dims) for i in graph.initializer)
    assert shapes[False] != shapes[True], "pad_gemm_outputs changes the graph tune sees, as it changes the build's"
