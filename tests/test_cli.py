"""The real CLI in a subprocess: user mistakes end in one located line and the contract's exit code."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_one_line_error, run_rlopt, write_tiny_recipe


def test_help_lists_commands() -> None:
    proc = run_rlopt("--help")
    assert proc.returncode == 0
    for command in ("compile", "verify", "inspect"):
        assert command in proc.stdout


@pytest.mark.parametrize(
    ("edit", "needles"),
    [
        (lambda t: t.replace("name: tiny-heads", "name: tiny-heads\n  bad: [unclosed"), ["invalid YAML"]),
        (lambda t: t + "colour: blue\n", ["colour", "unknown field"]),
        (lambda t: t.replace("policy_heads.py:PolicyValueHeads", "missing.py:PolicyValueHeads"),
         ["model.factory", "missing.py", "not found"]),
        (lambda t: t.replace("min: [1, 1, 32], opt: [2, 3, 32]", "min: [3, 1, 32], opt: [2, 3, 32]", 1),
         ["networks.policy.inputs.input0", "min <= opt <= max"]),
        (lambda t: t.replace("outputs: [logits]", "outputs: [logits, entropy]"),
         ["networks.policy.outputs", "returns 1 output(s)"]),
        (lambda t: t.replace("module: policy", "module: actor"), ["networks.policy.module", "'actor'"]),
        (lambda t: t.replace("checkpoint: ", "") .replace("seed: 3", "checkpoint: weights/none.pt"),
         ["model.checkpoint", "not found"]),
        (lambda t: t.replace("[1, 1, 32], opt: [2, 3, 32], max: [4, 6, 32]}", "[1, 1, 30], opt: [2, 3, 30], max: [4, 6, 30]}", 1),
         ["networks.policy.inputs", "forward fails"]),
    ],
)
def test_bad_recipe_exits_2_with_one_line(tmp_path: Path, edit, needles: list[str]) -> None:
    recipe = write_tiny_recipe(tmp_path, backends="[onnxruntime]")
    recipe.write_text(edit(recipe.read_text()))
    proc = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "out"))
    assert_one_line_error(proc, 2, *needles, "fix:")
    assert not (tmp_path / "out").exists(), "nothing half-written"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_unknown_backend_flag_and_missing_recipe(tmp_path: Path) -> None:
    recipe = write_tiny_recipe(tmp_path)
    proc = run_rlopt("compile", str(recipe), "--backend", "tflite")
    assert_one_line_error(proc, 2, "--backend tflite", "fix:")
    assert_one_line_error(run_rlopt("compile", str(tmp_path / "nope.yaml")), 2, "nope.yaml", "not found")


def test_verify_and_inspect_on_missing_or_corrupt_dir(tmp_path: Path) -> None:
    assert_one_line_error(run_rlopt("verify", str(tmp_path / "absent")), 2, "MODEL_DIR not found")
    (tmp_path / "half").mkdir()
    assert_one_line_error(run_rlopt("inspect", str(tmp_path / "half")), 2, "manifest.json", "missing")
    (tmp_path / "half" / "manifest.json").write_text("{not json")
    assert_one_line_error(run_rlopt("inspect", str(tmp_path / "half")), 2, "not valid JSON")


def test_compile_backend_flag_json_and_inspect(tmp_path: Path) -> None:
    recipe = write_tiny_recipe(tmp_path)
    proc = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "out"), "--backend", "onnxruntime", "--json")
    assert proc.returncode == 0, proc.stderr
    document = json.loads(proc.stdout)
    assert document["passed"] and set(document["manifest"]["networks"]["policy"]["artifacts"]) == {"onnxruntime"}
    inspect = run_rlopt("inspect", str(tmp_path / "out"))
    assert inspect.returncode == 0 and "tiny-heads" in inspect.stdout and "onnxruntime" in inspect.stdout
    as_json = run_rlopt("inspect", str(tmp_path / "out"), "--json")
    assert json.loads(as_json.stdout)["name"] == "tiny-heads"
