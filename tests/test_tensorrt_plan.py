"""The TensorRT build plan: profiles from the recipe, validated against the ONNX inputs, without TensorRT."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from onnx import TensorProto, helper

from rlopt.errors import RecipeError, StageError
from rlopt.backends.tensorrt.config import TensorRTConfig
from rlopt.recipe import InputSpec, NetworkSpec, ProfileRange
from rlopt.backends.tensorrt.plan import make_plan, onnx_inputs

ROOT = Path(__file__).resolve().parents[1]


def graph_with(inputs: dict[str, list], elem: int = TensorProto.FLOAT) -> object:
    values = [helper.make_tensor_value_info(name, elem, dims) for name, dims in inputs.items()]
    nodes = [helper.make_node("Identity", [name], [f"{name}_out"]) for name in inputs]
    outs = [helper.make_tensor_value_info(f"{name}_out", elem, None) for name in inputs]
    return helper.make_model(helper.make_graph(nodes, "g", values, outs))


def spec(inputs: dict[str, InputSpec], profiles: list | None = None, **kw) -> NetworkSpec:
    return NetworkSpec(inputs=inputs, outputs=["out"], profiles=profiles or [], **kw)


def plan(network: NetworkSpec, model: object, config: TensorRTConfig | None = None, recipe: Path = Path("r.yaml")):
    return make_plan(network, config or TensorRTConfig(), model, recipe_path=recipe, network="policy")


OBS = InputSpec(min=[1, 1, 64], opt=[4, 8, 64], max=[8, 16, 64])
MODEL = graph_with({"obs": ["batch", "obs_d1", 64]})


def test_profile_zero_is_the_inputs_min_opt_max() -> None:
    made = plan(spec({"obs": OBS}), MODEL)
    assert len(made.profiles) == 1
    shape = made.envelope["obs"]
    assert (shape.min, shape.opt, shape.max) == ((1, 1, 64), (4, 8, 64), (8, 16, 64))
    assert made.facts()["profiles"] == [{"obs": {"min": [1, 1, 64], "opt": [4, 8, 64], "max": [8, 16, 64]}}]


def test_builder_settings_come_from_the_tensorrt_section(tmp_path: Path) -> None:
    config = TensorRTConfig(workspace_mb=512, refittable=True, builder_optimization_level=5,
                            timing_cache="caches/a10g.cache", build_timeout_s=90)
    made = plan(spec({"obs": OBS}), MODEL, config, tmp_path / "recipe.yaml")
    assert made.workspace_bytes == 512 << 20 and made.refittable and made.builder_optimization_level == 5
    assert made.timing_cache == tmp_path / "caches" / "a10g.cache"
    assert made.time_budget_s == 90


def test_network_precision_wins_when_the_recipe_sets_it() -> None:
    config = TensorRTConfig(precision="fp16")
    assert plan(spec({"obs": OBS}, precision="fp32"), MODEL, config).precision == "fp32"
    assert plan(spec({"obs": OBS}), MODEL, config).precision == "fp16"
    assert "tensorrt.precision" in plan(spec({"obs": OBS}), MODEL, config).precision_source


def test_extra_profiles_are_validated_and_kept_in_order() -> None:
    small = {"obs": ProfileRange(min=[1, 1, 64], opt=[1, 1, 64], max=[1, 4, 64])}
    made = plan(spec({"obs": OBS}, [small]), MODEL)
    assert [p["obs"].max for p in made.profiles] == [(8, 16, 64), (1, 4, 64)]


@pytest.mark.parametrize("profile, message", [
    ({"obs": ProfileRange(min=[1, 1, 32], opt=[1, 1, 64], max=[1, 1, 64])}, "dim 2 is static 64 in the ONNX graph"),
    ({"obs": ProfileRange(min=[1, 1, 64], opt=[1, 1, 64], max=[16, 1, 64])}, "leaves the inputs' range 1..8"),
    ({"obs": ProfileRange(min=[1, 64], opt=[1, 64], max=[1, 64])}, "rank 2 but the ONNX input has rank 3"),
    ({"obs": ProfileRange(min=[2, 1, 64], opt=[1, 1, 64], max=[4, 1, 64])}, "needs 1 <= min <= opt <= max"),
    ({"other": ProfileRange(min=[1, 1, 64], opt=[1, 1, 64], max=[1, 1, 64])}, "gives inputs ['other']"),
])
def test_bad_extra_profiles_are_located_recipe_errors(profile: dict, message: str) -> None:
    with pytest.raises(RecipeError, match="networks.policy.profiles") as info:
        plan(spec({"obs": OBS}, [profile]), MODEL)
    assert message in str(info.value) and "fix:" in str(info.value)


def test_recipe_static_dim_must_match_the_graph() -> None:
    wide = InputSpec(min=[1, 1, 32], opt=[4, 8, 32], max=[8, 16, 32])
    with pytest.raises(RecipeError, match="dim 2 is static 64"):
        plan(spec({"obs": wide}), MODEL)


def test_shared_dynamic_dims_need_the_same_range() -> None:
    model = graph_with({"obs": ["batch", 64], "mask": ["batch", 6]})
    inputs = {"obs": InputSpec(min=[1, 64], opt=[2, 64], max=[8, 64]),
              "mask": InputSpec(min=[1, 6], opt=[2, 6], max=[4, 6])}
    with pytest.raises(RecipeError, match="same dim of 'obs'"):
        plan(spec(inputs), model)


def test_input_names_and_dtypes_are_checked() -> None:
    with pytest.raises(RecipeError, match=r"takes \['obs'\], the recipe names \['x'\]"):
        plan(spec({"x": OBS}), MODEL)
    with pytest.raises(StageError, match="takes float16, the recipe says float32"):
        plan(spec({"obs": OBS}), graph_with({"obs": ["batch", "obs_d1", 64]}, TensorProto.FLOAT16))


def test_onnx_inputs_skip_initializers() -> None:
    model = graph_with({"obs": ["batch", 64]})
    model.graph.input.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [64]))
    model.graph.initializer.append(helper.make_tensor("w", TensorProto.FLOAT, [64], [0.0] * 64))
    assert [i.name for i in onnx_inputs(model)] == ["obs"]
    assert onnx_inputs(model)[0].dims == ("batch", 64)


@pytest.mark.parametrize("inputs, dims, expected", [
    ({"obs": InputSpec(min=[1, 64], opt=[4, 64], max=[8, 64])}, {"obs": ["batch", 64]}, (8, (4, 8))),
    ({"obs": InputSpec(min=[2, 64], opt=[4, 64], max=[8, 64])}, {"obs": ["batch", 64]}, (0, ())),
    ({"obs": InputSpec(shape=[8, 64])}, {"obs": [8, 64]}, (0, ())),
    ({"obs": InputSpec(min=[1, 64], opt=[1, 64], max=[1, 64])}, {"obs": ["batch", 64]}, (0, ())),
    ({"a": InputSpec(min=[1, 4], opt=[2, 4], max=[8, 4]), "b": InputSpec(min=[1, 2], opt=[2, 2], max=[8, 2])},
     {"a": ["a_d0", 4], "b": ["b_d0", 2]}, (0, ())),
])
def test_batching_only_for_one_shared_batch_dim_from_1(inputs: dict, dims: dict, expected: tuple) -> None:
    batching = plan(spec(inputs), graph_with(dims)).batching()
    assert (batching.max_batch_size, batching.preferred) == expected


def test_cli_reports_a_bad_profile_in_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Through the CLI's entry point, in process (a fresh interpreter would spend seconds importing torch): exit 2,
    one stderr line naming the file, the field and the fix."""
    from rlopt.cli import main

    recipe = yaml.safe_load((ROOT / "tests" / "data" / "gpu_path.yaml").read_text())
    recipe["model"]["factory"] = str(ROOT / "tests" / "data" / "models" / "gpu_path.py") + ":GpuPathModel"
    recipe["model"]["kwargs"] = {"obs": 8, "hidden": 40, "width": 24, "n_actions": 3}
    recipe["networks"] = {"value": recipe["networks"]["value"]}
    recipe["networks"]["value"]["inputs"]["obs"] = {"dtype": "float32", "min": [1, 1, 8], "opt": [2, 2, 8],
                                                    "max": [4, 4, 8]}
    recipe["networks"]["value"]["profiles"] = [{"obs": {"min": [1, 1, 4], "opt": [1, 1, 8], "max": [1, 1, 8]}}]
    recipe["backends"] = ["onnxruntime"]
    recipe["verify"] = {"samples": 2}
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(recipe))
    with pytest.raises(SystemExit) as exited:
        main(["compile", str(path), "-o", str(tmp_path / "out")])
    stderr = capsys.readouterr().err
    assert exited.value.code == 2, stderr
    lines = [line for line in stderr.strip().splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert "bad.yaml: networks.value.profiles[0].obs: dim 2 is static 8" in lines[0] and "fix:" in lines[0]
    assert not (tmp_path / "out").exists()
