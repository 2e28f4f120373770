"""Fixtures of the bench and warmup tests.

A bench starts one worker interpreter per candidate; the tiny MODEL_DIR with every backend has seven, two of them
importing TVM. Tests of process handling and output use `ort_compiled` (five light workers); the tests that need
every backend read one shared bench of the policy network (`policy_bench`).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from rlopt.tools.bench import BenchReport, run_bench
from tests.conftest import CompileFactory, copy_model_dir, tiny_recipe_text
from tests.tools.common import tiny_recipe


@pytest.fixture(scope="session")
def ort_compiled(compiled: CompileFactory) -> Path:
    """The tiny recipe built for ONNX Runtime only; tests must not modify it."""
    return compiled(tiny_recipe_text("[onnxruntime]"), name="tiny.yaml")


@pytest.fixture(scope="session")
def policy_bench(tiny_compiled: Path) -> BenchReport:
    """One in-process bench of the tiny policy network: every backend, the eager model from the recipe, no
    torch.compile (its first compile takes many seconds)."""
    return run_bench(tiny_compiled, "policy", tiny_recipe(tiny_compiled), budget_s=0.05, torch_compile=False)


@pytest.fixture()
def ort_copy(ort_compiled: Path, tmp_path: Path) -> Path:
    """A private copy of `ort_compiled` that a test may write into (reports) or damage."""
    return copy_model_dir(ort_compiled, tmp_path)
