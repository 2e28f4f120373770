"""Stages in isolation: scripting keeps the branch, ONNX keeps the If, TVM fuses and stays exact."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import torch

from rlopt.errors import RecipeError, StageError
from rlopt.recipe import load_recipe
from rlopt.stages.export_onnx import dynamic_dim_names, export_onnx
from rlopt.stages.load_model import build_model, submodule
from rlopt.stages.script import script_network
from rlopt.backends.tvm.build import build_tvm, target_slug, tensorize_shape_comparisons
from tests.conftest import write_tiny_recipe


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object, object]:
    folder = tmp_path_factory.mktemp("stages")
    recipe_path = write_tiny_recipe(folder)
    recipe = load_recipe(recipe_path)
    model, _ = build_model(recipe.model, recipe_path)
    policy = submodule(model, "policy", recipe_path, "policy")
    spec = recipe.networks["policy"]
    out = script_network(policy, folder / "model.ts", recipe_path=recipe_path, network="policy", module_path="policy")
    assert out.facts["branches"] >= 1
    onnx_out = export_onnx(folder / "model.ts", spec, 17, folder / "model.onnx", recipe_path=recipe_path,
                           network="policy")
    return folder / "model.onnx", policy, recipe


def test_onnx_keeps_the_branch_and_names_dynamic_dims(exported: tuple[Path, object, object]) -> None:
    path, _, _ = exported
    model = onnx.load(str(path))
    assert "If" in {n.op_type for n in model.graph.node}
    dims = [d.dim_param or d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]
    assert dims == ["batch", "input0_d1", 32]


def test_tensorize_rewrites_the_shape_comparison_only(exported: tuple[Path, object, object]) -> None:
    path, _, _ = exported
    model = onnx.load(str(path))
    before = len(model.graph.node)
    assert tensorize_shape_comparisons(model) == 1
    assert len(model.graph.node) == before + 2
    onnx.checker.check_model(model)
    assert tensorize_shape_comparisons(model) == 0, "the rewritten Gather has a 1-D index: nothing left to do"


def test_tvm_build_fuses_and_is_exact_on_both_branches(exported: tuple[Path, object, object], tmp_path: Path) -> None:
    import tvm
    from tvm import relax

    path, policy, recipe = exported
    out = build_tvm(path, recipe.tvm, tmp_path, recipe_path=tmp_path / "r.yaml", network="policy")
    assert out.artifact is not None and out.artifact.name == "tvm-llvm.so"
    assert any(name.startswith("fused_matmul") and "relu" in name for name in out.facts["fused_kernels"])
    vm = relax.VirtualMachine(tvm.runtime.load_module(str(out.artifact)), tvm.cpu())
    for shape in [(1, 1, 32), (1, 5, 32), (3, 2, 32), (4, 6, 32)]:
        x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
        expected = policy(torch.from_numpy(x)).detach().numpy()
        got = vm["main"](tvm.runtime.tensor(x)).numpy()
        np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


def test_dynamic_dim_names_share_batch_only_when_ranges_agree() -> None:
    from rlopt.recipe import InputSpec

    same = {"a": InputSpec(min=[1, 4], opt=[2, 4], max=[8, 4]), "b": InputSpec(min=[1, 2], opt=[2, 3], max=[8, 9])}
    assert dynamic_dim_names(same) == {"a": {0: "batch"}, "b": {0: "batch", 1: "b_d1"}}
    different = {"a": InputSpec(min=[1], opt=[1], max=[8]), "b": InputSpec(min=[1], opt=[1], max=[4])}
    assert dynamic_dim_names(different) == {"a": {0: "a_d0"}, "b": {0: "b_d0"}}


def test_target_slug() -> None:
    assert target_slug({"kind": "llvm"}) == "llvm"
    assert target_slug({"kind": "llvm", "mcpu": "znver4", "num-cores": 2}) == "llvm-znver4"
    assert target_slug({"kind": "cuda", "arch": "sm_86"}) == "cuda-sm_86"


class _Unscriptable(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * len({1: object()})


def test_unscriptable_module_names_module_and_construct(tmp_path: Path) -> None:
    with pytest.raises(StageError) as info:
        script_network(_Unscriptable(), tmp_path / "m.ts", recipe_path=tmp_path / "r.yaml", network="policy",
                       module_path="policy.head")
    message = str(info.value)
    assert "networks.policy.module" in message and "'policy.head' cannot be scripted" in message
    assert "test_stages.py" in message and "\n" not in message


def test_factory_and_checkpoint_errors(tmp_path: Path) -> None:
    recipe_path = write_tiny_recipe(tmp_path)
    recipe = load_recipe(recipe_path)
    bad_attr = recipe.model.model_copy(update={"factory": "models/policy_heads.py:Nope"})
    with pytest.raises(RecipeError, match="'Nope' is not a callable"):
        build_model(bad_attr, recipe_path)
    raising = recipe.model.model_copy(update={"kwargs": {"hidden": -1}})
    with pytest.raises(RecipeError, match=r"model.kwargs.*raised RuntimeError"):
        build_model(raising, recipe_path)
    torch.save({"fc1.weight": torch.zeros(1)}, tmp_path / "wrong.pt")
    wrong_keys = recipe.model.model_copy(update={"checkpoint": "wrong.pt"})
    with pytest.raises(RecipeError, match="keys do not match"):
        build_model(wrong_keys, recipe_path)
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(RecipeError, match="not a state_dict"):
        build_model(recipe.model.model_copy(update={"checkpoint": "list.pt"}), recipe_path)
    with pytest.raises(RecipeError, match="not found"):
        build_model(recipe.model.model_copy(update={"checkpoint": "absent.pt"}), recipe_path)
    model, _ = build_model(recipe.model, recipe_path)
    with pytest.raises(RecipeError, match="networks.policy.module"):
        submodule(model, "policy.missing", recipe_path, "policy")


def test_checkpoint_round_trip_pt_and_safetensors(tmp_path: Path) -> None:
    from safetensors.torch import save_file

    recipe_path = write_tiny_recipe(tmp_path)
    recipe = load_recipe(recipe_path)
    model, _ = build_model(recipe.model, recipe_path)
    state = {k: torch.randn_like(v) for k, v in model.state_dict().items()}
    torch.save(state, tmp_path / "w.pt")
    save_file(state, str(tmp_path / "w.safetensors"))
    for name in ("w.pt", "w.safetensors"):
        loaded, facts = build_model(recipe.model.model_copy(update={"checkpoint": name}), recipe_path)
        assert torch.equal(loaded.state_dict()["policy.fc1.weight"], state["policy.fc1.weight"])
        assert len(facts.facts["checkpoint_sha256"]) == 64
