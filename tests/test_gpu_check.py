"""scripts/gpu_check.sh, the one prepared check for a GPU machine: its path without a GPU (what CI runs), its one-line
refusal of a machine that lacks a module, and the recipe it compiles. Its GPU path ran only where a GPU was lent."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _script():
    spec = importlib.util.spec_from_file_location("gpu_check", ROOT / "scripts" / "gpu_check.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_without_a_gpu_it_says_so_in_one_line_and_exits_0(tmp_path: Path) -> None:
    env = dict(os.environ, CUDA_VISIBLE_DEVICES="-1", PYTHON=sys.executable)
    done = subprocess.run(["bash", str(ROOT / "scripts" / "gpu_check.sh"), str(tmp_path / "report.json")],
                          capture_output=True, text=True, timeout=120, env=env, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        "gpu_check: CUDA_VISIBLE_DEVICES hides every GPU; nothing to check on this machine"]
    assert done.stderr == "" and not (tmp_path / "report.json").exists()


def test_a_gpu_machine_missing_a_module_gets_one_line_naming_it(monkeypatch: pytest.MonkeyPatch,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    script = _script()
    real = script.find_spec
    monkeypatch.setattr(script, "find_spec", lambda name: None if name in ("pydantic", "yaml") else real(name))
    monkeypatch.setattr("rlopt.machine.gpu_absent_reason", lambda: None)
    monkeypatch.setattr(sys, "argv", ["gpu_check.py"])
    assert script.main() == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["gpu_check: missing python modules: pydantic, pyyaml; fix: pip install "
                                         "pydantic pyyaml"]


def test_it_compiles_the_default_recipe_as_torchscript_on_cuda(tmp_path: Path) -> None:
    from rlopt.recipe import load_recipe

    recipe = load_recipe(_script().cuda_recipe(tmp_path))
    assert recipe.name == "policy-value-heads" and recipe.backends == ["torchscript"]
    assert recipe.torchscript.device == "cuda" and recipe.torchscript.graphs
    assert recipe.networks["policy"].inputs["input0"].max == [8, 16, 768]


def test_timings_are_interleaved_medians_per_candidate() -> None:
    order: list[str] = []
    medians = _script().medians_interleaved({"a": lambda: order.append("a"), "b": lambda: order.append("b")},
                                            rounds=4)
    assert set(medians) == {"a", "b"} and all(value > 0 for value in medians.values())
    assert order.count("a") > 4 and order.count("b") > 4
