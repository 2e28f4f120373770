"""`torchscript: {device: cuda}` through compile: skipped with the reason where CUDA is missing (the rest of the compile
goes on), and, with a torch whose CUDA is the CPU (tests/cuda_standin.py), built, gated (graphs and the eager path),
recorded with its graph shapes, and served by `rlopt.load`."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.compile.cache import StageCache
from rlopt.manifest import read_manifest
from tests.conftest import write_tiny_recipe
from tests.cuda_standin import make_cuda_torch

ON_CUDA = "torchscript: {device: cuda}\n"


def _cuda_missing() -> str | None:
    from rlopt.backends.torchscript.cuda.gate import unavailable_reason

    return unavailable_reason()


@pytest.mark.skipif(_cuda_missing() is None, reason="this machine runs TorchScript on CUDA: nothing is skipped")
def test_without_cuda_the_torchscript_build_is_skipped_with_the_reason(tmp_path: Path) -> None:
    from rlopt.compile import compile_recipe

    recipe = write_tiny_recipe(tmp_path, backends="[torchscript, onnxruntime]", extra=ON_CUDA)
    result = compile_recipe(recipe, tmp_path / "out", cache=StageCache(enabled=False))
    assert result.passed, result.failures
    policy = read_manifest(result.model_dir).networks["policy"]
    assert policy.artifacts["torchscript"].skipped == _cuda_missing()
    assert policy.artifacts["onnxruntime"].verified and policy.selected == "onnxruntime"


def test_on_cuda_the_graphs_are_built_gated_and_served(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.compile import compile_recipe

    fake = make_cuda_torch()
    monkeypatch.setattr("rlopt.backends.torchscript.cuda.gate.unavailable_reason", lambda: None)
    monkeypatch.setattr("rlopt.backends.torchscript.cuda.gate.cuda_torch", lambda: fake)
    monkeypatch.setattr("rlopt.backends.torchscript.cuda.gate.device", lambda: "cpu")
    monkeypatch.setattr("rlopt.backends.torchscript.cuda.gate.exact_fp32", lambda torch: None)
    recipe = write_tiny_recipe(tmp_path, backends="[torchscript]", extra=ON_CUDA)
    result = compile_recipe(recipe, tmp_path / "out", cache=StageCache(enabled=False))
    assert result.passed, result.failures
    record = read_manifest(result.model_dir).networks["policy"].artifacts["torchscript"]
    assert record.verified and record.facts.as_dict()["device"] == "cuda" and record.facts.as_dict()["cuda_graphs"] is True
    assert record.facts.as_dict()["graph_shapes"]["opt"] == {"input0": [2, 3, 32]}
    assert record.facts.as_dict()["variant_parity"]["eager"]["passed"]
    with rlopt.load(result.model_dir, "policy", backend="torchscript") as session:
        for shape in ([2, 3, 32], [3, 5, 32]):  # a named shape (a graph), another one (eager)
            x = np.random.default_rng(0).standard_normal(shape).astype(np.float32)
            assert session.run({"input0": x})["logits"].shape == (shape[0], shape[1], 5)
