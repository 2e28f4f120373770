"""Recipe validation: every mistake is one RecipeError line naming the file, the field and the fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlopt.errors import RecipeError
from rlopt.backends import DEFAULT_BACKENDS
from rlopt.recipe import load_recipe
from tests.conftest import RECIPES, write_tiny_recipe


def _error(tmp_path: Path, text: str) -> str:
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(RecipeError) as info:
        load_recipe(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "fix:" in message
    return message


BASE = """\
name: ok
model: {factory: models/policy_heads.py:PolicyHead}
networks:
  policy:
    inputs:
      input0: {dtype: float32, min: [1, 8], opt: [2, 8], max: [4, 8]}
    outputs: [logits]
"""


def test_bundled_recipes_validate_and_fill_defaults() -> None:
    for path in sorted(RECIPES.glob("*.yaml")):
        recipe = load_recipe(path)
        assert recipe.networks
    recipe = load_recipe(RECIPES / "policy_value_heads.yaml")
    assert recipe.name == "policy-value-heads"
    assert recipe.networks["policy"].inputs["input0"].min == [1, 1, 768]
    assert recipe.networks["policy"].inputs["input0"].max == [8, 16, 768]


def test_defaults_are_filled(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(BASE)
    recipe = load_recipe(path)
    net = recipe.networks["policy"]
    assert (net.kind, net.precision, net.module) == ("generic", "fp32", "")
    assert recipe.backends == list(DEFAULT_BACKENDS), "a backend registered later joins only the recipes naming it"
    assert recipe.pad_gemm == "auto" and recipe.tvm.target == {"kind": "llvm"} and recipe.model.seed == 0
    assert "backends:" in recipe.resolved_yaml() and len(recipe.sha256()) == 64


def test_static_shape_fills_min_opt_max(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(BASE.replace("{dtype: float32, min: [1, 8], opt: [2, 8], max: [4, 8]}", "{shape: [3, 8]}"))
    spec = load_recipe(path).networks["policy"].inputs["input0"]
    assert spec.min == spec.opt == spec.max == [3, 8] and spec.dynamic_axes == []


@pytest.mark.parametrize(
    ("text", "needles"),
    [
        ("name: [unclosed\n", ["line 2", "invalid YAML"]),
        ("- a list\n", ["expected a mapping"]),
        (BASE + "colour: blue\n", ["colour", "unknown field"]),
        (BASE.replace("outputs: [logits]", "outputs: [logits]\n    kind: critic"), ["networks.policy.kind"]),
        (BASE.replace("name: ok", "name: Bad Name"), ["name"]),
        (BASE.replace("min: [1, 8]", "min: [5, 8]"), ["networks.policy.inputs.input0", "min <= opt <= max"]),
        (BASE.replace("min: [1, 8]", "min: [1, 8, 1]"), ["rank mismatch"]),
        (BASE.replace("dtype: float32", "dtype: float13"), ["networks.policy.inputs.input0.dtype"]),
        (BASE.replace("opt: [2, 8], ", ""), ["missing opt"]),
        (BASE.replace("outputs: [logits]", "outputs: []"), ["networks.policy.outputs"]),
        ("name: ok\nmodel: {factory: m.py:F}\nnetworks: {}\n", ["networks", "at least one network"]),
        (BASE + "backends: [tvm, cuda-magic]\n", ["backends"]),
        (BASE.replace("PolicyHead}", "PolicyHead}\nmodel_x: 1"), ["model_x"]),
        (BASE.replace("models/policy_heads.py:PolicyHead", "no_colon_here"), ["model.factory"]),
        (BASE + "verify: {samples: 0}\n", ["verify.samples"]),
        (BASE + "pad_gemm: -4\n", ["pad_gemm"]),
        (BASE + "tvm: {target: {mcpu: znver4}}\n", ["tvm.target", "kind"]),
    ],
)
def test_bad_recipes_fail_with_one_located_line(tmp_path: Path, text: str, needles: list[str]) -> None:
    message = _error(tmp_path, text)
    for needle in needles:
        assert needle in message, (needle, message)


def test_missing_recipe_file(tmp_path: Path) -> None:
    with pytest.raises(RecipeError, match="recipe not found"):
        load_recipe(tmp_path / "absent.yaml")


def test_tiny_recipe_helper_is_valid(tmp_path: Path) -> None:
    recipe = load_recipe(write_tiny_recipe(tmp_path))
    assert set(recipe.networks) == {"policy", "value"}


# contract sections 7 and 8: dtypes, integer ranges, recurrent state, verify.steps

STATEFUL = """\
name: ok
model: {factory: models/coverage.py:GruCellActor}
networks:
  actor:
    kind: policy
    inputs:
      obs: {dtype: float32, min: [1, 8], opt: [4, 8], max: [8, 8]}
      h: {dtype: float32, min: [1, 32], opt: [4, 32], max: [8, 32]}
    outputs: [logits, h_new]
    state: {h: h_new}
"""


def test_every_contract_dtype_is_accepted(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    for dtype in ("float32", "float16", "float64", "int64", "int32", "uint8", "bool"):
        path.write_text(BASE.replace("dtype: float32", f"dtype: {dtype}"))
        assert load_recipe(path).networks["policy"].inputs["input0"].dtype == dtype


def test_integer_range_is_validated(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(BASE.replace("dtype: float32,", "dtype: int64, range: [0, 499],"))
    assert load_recipe(path).networks["policy"].inputs["input0"].range == [0, 499]
    message = _error(tmp_path, BASE.replace("dtype: float32,", "dtype: float32, range: [0, 4],"))
    assert "networks.policy.inputs.input0.range" in message and "integer" in message
    message = _error(tmp_path, BASE.replace("dtype: float32,", "dtype: int32, range: [5, 1],"))
    assert "lo <= hi" in message
    message = _error(tmp_path, BASE.replace("dtype: float32,", "dtype: uint8, range: [0, 300],"))
    assert "does not fit uint8" in message


def test_state_and_steps_are_read(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(STATEFUL + "verify: {steps: 6}\n")
    recipe = load_recipe(path)
    assert recipe.networks["actor"].state == {"h": "h_new"} and recipe.verify.steps == 6
    path.write_text(STATEFUL)
    assert load_recipe(path).verify.steps == 4


@pytest.mark.parametrize("change, needles", [
    (("state: {h: h_new}", "state: {hidden: h_new}"), ["networks.actor.state", "'hidden' is not an input"]),
    (("state: {h: h_new}", "state: {h: h_next}"), ["networks.actor.state", "'h_next'", "not one of the outputs"]),
    (("state: {h: h_new}", "state: {h: h_new, obs: h_new}"), ["networks.actor.state", "two inputs"]),
    (("h: {dtype: float32, min: [1, 32], opt: [4, 32], max: [8, 32]}",
      "h: {dtype: float32, min: [1, 32], opt: [4, 32], max: [16, 32]}"), ["networks.actor.state", "batch"]),
    (("h: {dtype: float32,", "h: {dtype: int64,"), ["networks.actor.state", "float dtype"]),
    (("    state: {h: h_new}\n", "    state: {h: h_new}\nverify: {steps: 0}\n"), ["verify.steps"]),
])
def test_state_mistakes_are_one_located_line(tmp_path: Path, change: tuple[str, str], needles: list[str]) -> None:
    message = _error(tmp_path, STATEFUL.replace(*change))
    for needle in needles:
        assert needle in message, (needle, message)


def test_the_ci_section_has_the_contract_defaults_and_is_resolved(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text(BASE)
    ci = load_recipe(path).ci
    assert (ci.max_latency_ratio, ci.max_drift_kl, ci.allow_dropped_backends) == (1.10, None, False)
    path.write_text(BASE + "ci: {max_drift_kl: 0.01, allow_dropped_backends: true}\n")
    recipe = load_recipe(path)
    assert "ci:\n  max_latency_ratio: 1.1\n  max_drift_kl: 0.01\n  allow_dropped_backends: true\n" in \
        recipe.resolved_yaml()
    message = _error(tmp_path, BASE + "ci: {max_latency_ratio: 0.9}\n")
    assert "ci.max_latency_ratio" in message and "greater than or equal to 1" in message
    assert "ci.max_drift" in _error(tmp_path, BASE + "ci: {max_drift: 0.1}\n")
