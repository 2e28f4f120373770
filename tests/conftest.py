"""Shared fixtures: a tiny recipe (same model code as the default recipe, small dims) compiled once per session."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"

TINY_RECIPE = """\
name: tiny-heads
model:
  factory: models/policy_heads.py:PolicyValueHeads
  kwargs: {{hidden: 32, width: 16, n_actions: 5}}
  seed: 3
networks:
  policy:
    module: policy
    kind: policy
    inputs:
      input0: {{dtype: float32, min: [1, 1, 32], opt: [2, 3, 32], max: [4, 6, 32]}}
    outputs: [logits]
  value:
    module: value
    kind: value
    inputs:
      input0: {{dtype: float32, min: [1, 1, 32], opt: [2, 3, 32], max: [4, 6, 32]}}
    outputs: [value]
backends: {backends}
verify:
  samples: 4
"""


@pytest.fixture(scope="session", autouse=True)
def private_stage_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Tests (and the CLI subprocesses they start) use their own stage cache, never the user's."""
    root = tmp_path_factory.mktemp("rlopt-cache")
    os.environ["RLOPT_CACHE"] = str(root)
    return root


def write_tiny_recipe(folder: Path, backends: str = "[torchscript, onnxruntime, tvm, tensorrt]",
                      extra: str = "", name: str = "tiny.yaml") -> Path:
    """A recipe in `folder` with the default recipe's model code copied beside it."""
    (folder / "models").mkdir(parents=True, exist_ok=True)
    shutil.copy(RECIPES / "models" / "policy_heads.py", folder / "models" / "policy_heads.py")
    path = folder / name
    path.write_text(TINY_RECIPE.format(backends=backends) + extra)
    return path


@pytest.fixture(scope="session")
def tiny_compiled(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A MODEL_DIR compiled from the tiny recipe with every backend; tests must not modify it."""
    from rlopt.compile import compile_recipe

    folder = tmp_path_factory.mktemp("tiny")
    result = compile_recipe(write_tiny_recipe(folder), folder / "out")
    assert result.passed, result.failures
    return result.model_dir


@pytest.fixture()
def tiny_copy(tiny_compiled: Path, tmp_path: Path) -> Path:
    """A private copy of the compiled MODEL_DIR that a test may damage."""
    target = tmp_path / "model_dir"
    shutil.copytree(tiny_compiled, target)
    return target


def run_rlopt(*args: str, cwd: Path | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The real CLI in a fresh process."""
    env = dict(os.environ, COLUMNS="200")
    return subprocess.run([sys.executable, "-m", "rlopt", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=timeout, env=env)


def assert_one_line_error(proc: subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """A user error: the contract's exit code, one line on stderr naming what is wrong, no traceback."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]
