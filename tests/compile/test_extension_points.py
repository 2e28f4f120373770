"""Extension points: where the model comes from, checks after export, tune's front end (multi-step verification:
tests/test_parity.py)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlopt.stages.frontend import (
    FRONTEND,
    FRONTEND_TO_PADDING,
    ExportOnnx,
    FactorySource,
    PadGemm,
    PadGemmForTuning,
    SpecializationGuard,
)
from rlopt.stages.base import Context
from rlopt.errors import StageError
from rlopt.recipe import load_recipe
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
    from rlopt.stages.script import graph_sha256, weights_sha256

    assert graph_sha256(first) == graph_sha256(second) and weights_sha256(first) != weights_sha256(second)


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
    from rlopt.compile.sources import model_source
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
