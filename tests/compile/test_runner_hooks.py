"""The verify stage drives the Runner hooks: parity_variants must pass, gated_variants are recorded as tried."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlopt.backends.base import Runner
from rlopt.backends.tvm.facts import TvmFacts
from rlopt.compile.measure import VerifyBackend
from rlopt.stages.base import Context, StageOutput
from rlopt.parity import Tolerance
from rlopt.recipe import load_recipe
from rlopt.reference import Reference
from tests.conftest import write_tiny_recipe


def _right(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [feeds["input0"][..., :5] * 2.0]


def _wrong(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [feeds["input0"][..., :5] * 3.0]


class FakeRunner(Runner):
    def __init__(self, dynamic: object = _right) -> None:
        self.input_names, self.dynamic, self.closed = ["input0"], dynamic, False

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return _right(feeds)

    def parity_variants(self) -> dict:
        return {"dynamic": self.dynamic}

    def gated_variants(self) -> dict:
        return {"padded": _wrong}

    def close(self) -> None:
        self.closed = True


@pytest.fixture()
def ctx(tmp_path: Path) -> Context:
    recipe_path = write_tiny_recipe(tmp_path, backends="[tvm]")
    recipe = load_recipe(recipe_path)
    context = Context(recipe, recipe_path, "policy", recipe.networks["policy"], tmp_path / "staging")
    context.dir.mkdir(parents=True)
    rng = np.random.default_rng(0)
    inputs = rng.standard_normal((2, 2, 3, 32)).astype(np.float32)
    arrays = {"opt:in:input0": inputs, "opt:out:logits": inputs[..., :5] * 2.0}
    Reference(arrays, ["input0"], ["logits"]).save(context.dir / "reference.npz")
    context.artifacts["reference.npz"] = context.dir / "reference.npz"
    (context.dir / "fake.so").write_bytes(b"library")
    return context


def _measure(ctx: Context, runner: FakeRunner, monkeypatch: pytest.MonkeyPatch) -> tuple:
    monkeypatch.setattr("rlopt.compile.measure.open_runner", lambda *args: runner)
    stage = VerifyBackend("tvm", StageOutput(ctx.dir / "fake.so", TvmFacts()), Tolerance(1e-5, 1e-4, 1e-4))
    return stage.measure(ctx)


def test_variants_are_gated_and_a_failed_trick_is_recorded_not_fatal(ctx: Context,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    runner = FakeRunner()
    record, failure = _measure(ctx, runner, monkeypatch)
    assert failure is None and record.parity.passed and runner.closed
    assert record.facts.gate_passed("dynamic") and not record.facts.gate_passed("padded")
    assert set(record.facts.variant_parity) == {"dynamic", "padded"}, "the failed trick is recorded"
    assert record.latency_us == {}, "the `latency` stage times every verified backend, not verify"


def test_a_failing_parity_variant_fails_the_backend(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    record, failure = _measure(ctx, FakeRunner(dynamic=_wrong), monkeypatch)
    assert failure is not None and "policy/tvm (dynamic): parity failed" in failure
    assert not record.parity.passed
