"""Padding a shape into a bigger static build: which dims may be padded, the gate that switches it on, results."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlopt
from rlopt.backends.tvm.padding import PaddedCall, padding_plan
from rlopt.backends.tvm.runner import VmCall
from rlopt.manifest import read_manifest
from rlopt.runtime import open_artifact, unbucketed_p50, unbucketed_variant
from tests.conftest import run_rlopt

HEADS = [{"shapes": {"x": [1, 1, 32]}, "output_shapes": [[1, 1, 5]]},
         {"shapes": {"x": [2, 3, 32]}, "output_shapes": [[2, 3, 5]]},
         {"shapes": {"x": [4, 6, 32]}, "output_shapes": [[4, 6, 5]]}]


def test_the_plan_pads_the_dims_an_output_follows_and_cuts_them_back() -> None:
    plan = padding_plan(HEADS, ["x"])
    assert plan is not None and plan.paddable == {(0, 0), (0, 1)} and plan.covers_range
    buckets = [tuple(tuple(b["shapes"]["x"]) for _ in [0]) for b in HEADS]
    assert plan.bucket_for(((2, 1, 32),), buckets) == ((2, 3, 32),)
    assert plan.bucket_for(((3, 3, 32),), buckets) == ((4, 6, 32),)
    assert plan.bucket_for(((2, 3, 32),), buckets) == ((2, 3, 32),)
    assert plan.bucket_for(((2, 3, 32),), buckets, strict=True) == ((4, 6, 32),)
    assert plan.bucket_for(((4, 6, 32),), buckets, strict=True) is None
    assert plan.bucket_for(((2, 3, 16),), buckets) is None  # a fixed dim is never padded
    assert plan.cuts(((3, 2, 32),)) == [(slice(0, 3), slice(0, 2), slice(None))]


def test_a_dim_no_output_follows_is_not_padded() -> None:
    pooled = [{**b, "output_shapes": [[b["shapes"]["x"][0], 5]]} for b in HEADS]  # the sequence is reduced away
    plan = padding_plan(pooled, ["x"])
    assert plan is not None and plan.paddable == {(0, 0)} and not plan.covers_range
    buckets = [(tuple(b["shapes"]["x"]),) for b in HEADS]
    assert plan.bucket_for(((1, 3, 32),), buckets) == ((2, 3, 32),)
    assert plan.bucket_for(((1, 4, 32),), buckets) is None


BATCHES = [1, 2, 4]


@pytest.mark.parametrize(("builds", "names"), [
    # an output dim no input dim explains
    ([{"shapes": {"x": [b, 8]}, "output_shapes": [[b, 7 + 2 * k]]} for k, b in enumerate(BATCHES)], ["x"]),
    # an output dim two input dims explain equally
    ([{"shapes": {"x": [b, 8], "y": [b, 3]}, "output_shapes": [[b]]} for b in BATCHES], ["x", "y"]),
    (HEADS[:1], ["x"]),  # one build: nothing to pad into
    ([{k: v for k, v in b.items() if k != "output_shapes"} for b in HEADS], ["x"]),  # output shapes unrecorded
], ids=["unexplained", "ambiguous", "one-build", "no-output-shapes"])
def test_no_plan_when_an_output_dim_cannot_be_cut_back(builds: list[dict[str, Any]], names: list[str]) -> None:
    assert padding_plan(builds, names) is None


@pytest.mark.parametrize("network", ["policy", "value"])
def test_a_shape_without_its_own_build_is_padded_into_one_and_matches_torchscript(tiny_compiled: Path,
                                                                                  network: str) -> None:
    import torch

    record = read_manifest(tiny_compiled).networks[network]
    gate = record.artifacts["tvm"].facts.as_dict()["variant_parity"]["padded"]
    assert gate["passed"] and gate["compared"] > 0
    session = rlopt.load(tiny_compiled, network, backend="tvm")
    module = torch.jit.load(str(tiny_compiled / record.files["model.ts"].path))
    rng = np.random.default_rng(21)
    kept = []
    for shape in [(3, 2, 32), (1, 4, 32), (3, 2, 32), (2, 1, 32), (4, 5, 32)]:  # alternating shapes share a build
        x = rng.standard_normal(shape).astype(np.float32)
        got = session.run({"input0": x})[session.outputs[0]]
        want = module(torch.from_numpy(x)).detach().numpy()
        assert got.shape == want.shape
        np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-4)
        kept.append((got, got.copy()))
        plan = session._gen.runners["tvm"]._local.plans[((shape, np.dtype(np.float32)),)]
        assert isinstance(plan, PaddedCall)
    assert all(np.array_equal(got, copy) for got, copy in kept)
    if network == "policy":
        inspect = run_rlopt("inspect", str(tiny_compiled))
        assert "tvm: shapes without their own library: zero-padded into the smallest bigger tuned library" in \
            inspect.stdout


def test_without_the_gates_pass_other_shapes_take_the_dynamic_library(tiny_compiled: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    artifact = record.artifacts["tvm"].model_copy(deep=True)
    artifact.facts = artifact.facts.updated(variant_parity={k: v for k, v in artifact.facts.variant_parity.items()
                                                            if k != "padded"})
    runner = open_artifact(tiny_compiled, "tvm", artifact, list(record.inputs))
    assert runner.padding is not None and not runner.pads  # type: ignore[attr-defined]
    runner.infer({"input0": np.ones((3, 2, 32), np.float32)})
    assert isinstance(runner._local.plans[(((3, 2, 32), np.dtype(np.float32)),)], VmCall)  # type: ignore[attr-defined]
    # compile timed only the path that serves other shapes (padded); the dynamic one, unmeasured, is never picked
    assert unbucketed_variant("tvm", artifact.facts) == "dynamic" and unbucketed_p50("tvm", artifact) == float("inf")
    assert unbucketed_variant("tvm", record.artifacts["tvm"].facts) == "padded"
    assert unbucketed_p50("tvm", record.artifacts["tvm"]) == record.artifacts["tvm"].facts.as_dict()["variant_latency_us"]["padded"]["opt"]
    assert set(record.artifacts["tvm"].facts.as_dict()["variant_latency_us"]) == {"padded"}


COUPLED_MODEL = '''
import torch
from torch import nn


class Centered(nn.Module):
    """Each row minus the batch mean: rows are not independent, so zero rows padded in change the real ones."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x - x.mean(dim=0, keepdim=True))
'''

COUPLED_RECIPE = """\
name: coupled
model:
  factory: models/centered.py:Centered
  seed: 1
networks:
  value:
    kind: value
    inputs:
      x: {dtype: float32, min: [1, 8], opt: [2, 8], max: [4, 8]}
    outputs: [value]
backends: [onnxruntime, tvm]
verify:
  samples: 4
"""


@pytest.mark.slow
def test_a_network_that_mixes_rows_fails_the_gate_and_is_never_padded(tmp_path: Path) -> None:
    import torch

    from rlopt.compile import compile_recipe
    from rlopt.verify import verify_model_dir

    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "centered.py").write_text(COUPLED_MODEL)
    (tmp_path / "coupled.yaml").write_text(COUPLED_RECIPE)
    result = compile_recipe(tmp_path / "coupled.yaml", tmp_path / "out")
    assert result.passed, result.failures
    tvm = read_manifest(result.model_dir).networks["value"].artifacts["tvm"]
    assert tvm.verified and tvm.facts.as_dict()["variant_parity"]["padded"]["passed"] is False
    session = rlopt.load(result.model_dir, "value", backend="tvm")
    x = np.random.default_rng(5).standard_normal((3, 8)).astype(np.float32)
    got = session.run({"x": x})["value"]
    assert isinstance(session._gen.runners["tvm"]._local.plans[(((3, 8), np.dtype(np.float32)),)], VmCall)
    module = torch.jit.load(str(result.model_dir / "value" / "model.ts"))
    np.testing.assert_allclose(got, module(torch.from_numpy(x)).detach().numpy(), atol=1e-5, rtol=1e-4)
    assert verify_model_dir(result.model_dir).passed
    inspect = run_rlopt("inspect", str(result.model_dir))
    assert "tvm: shapes without their own library: the dynamic library (padding failed the parity gate" in inspect.stdout
    shutil.rmtree(tmp_path / "out")
