"""The one parity gate (`rlopt.verify.gate_runner`), on a stand-in runner: what must pass, what is only recorded,
and on how many samples each path runs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pytest

from rlopt.backends.base import Runner
from rlopt.backends.tvm.facts import TvmFacts
from rlopt.parity import Tolerance
from rlopt.reference import Reference
from rlopt.verify import gate_runner

TOL = Tolerance(1e-5, 1e-4, 1e-4)
SHAPES = {"min": (1, 4), "max": (2, 4)}
SAMPLES = 6
# two static builds whose output follows the batch dim: padding covers every shape (facts like TVM's)
BUILDS = TvmFacts.of({"shape_builds": [{"shapes": {"x": [1, 4]}, "output_shapes": [[1, 2]]},
                                       {"shapes": {"x": [2, 4]}, "output_shapes": [[2, 2]]}]})


def _reference() -> Reference:
    rng = np.random.default_rng(0)
    arrays: dict[str, np.ndarray] = {}
    for point, shape in SHAPES.items():
        x = rng.standard_normal((SAMPLES, *shape)).astype(np.float32)
        arrays[f"{point}:in:x"] = x
        arrays[f"{point}:out:y"] = x[..., :2] * 2
    return Reference(arrays, ["x"], ["y"])


def _exact(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [feeds["x"][..., :2] * 2]


def _off(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    return [feeds["x"][..., :2] * 2 + 1.0]


OFF_BY_ONE = "output 'y': outside atol/rtol (max_abs 1, max_rel 112; atol 1 would pass)"


def _raises(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    raise RuntimeError("boom")


class StandIn(Runner):
    """Counts the samples each path is called on."""

    def __init__(self, main: Callable[..., Any] = _exact, required: dict[str, Callable[..., Any]] | None = None,
                 tricks: dict[str, Callable[..., Any]] | None = None) -> None:
        self.input_names = ["x"]
        self.calls: dict[str, int] = {}
        self._main = self._counted("main", main)
        self._required = {n: self._counted(n, f) for n, f in (required or {}).items()}
        self._tricks = {n: self._counted(n, f) for n, f in (tricks or {}).items()}

    def _counted(self, name: str, infer: Callable[..., Any]) -> Callable[..., Any]:
        def call(feeds: dict[str, np.ndarray]) -> Any:
            self.calls[name] = self.calls.get(name, 0) + 1
            return infer(feeds)
        return call

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        return self._main(feeds)  # type: ignore[no-any-return]

    def parity_variants(self) -> dict[str, Any]:
        return self._required

    def gated_variants(self) -> dict[str, Any]:
        return self._tricks


def test_everything_passing_records_tricks_then_required_paths_on_the_first_samples() -> None:
    runner = StandIn(required={"dynamic": _exact}, tricks={"padded": _exact})
    result = gate_runner(runner, _reference(), "value", "categorical", TOL, variant_samples=4)
    assert result.passed and result.failure("net/tvm") is None
    assert list(result.variant_parity) == ["padded", "dynamic"]
    assert all(v["passed"] for v in result.variant_parity.values())
    assert runner.calls == {"main": 2 * SAMPLES, "padded": 2 * 4, "dynamic": 2 * 4}
    assert result.serving is None and result.serving_infer is None  # no per-shape builds in these facts


def test_the_required_path_runs_once_per_shape_when_padding_serves_every_other_shape() -> None:
    runner = StandIn(required={"dynamic": _exact}, tricks={"padded": _exact})
    result = gate_runner(runner, _reference(), "value", "categorical", TOL, variant_samples=4, facts=BUILDS)
    assert result.passed and result.serving == "padded"
    assert runner.calls["dynamic"] == 2 and runner.calls["padded"] == 2 * 4
    assert result.serving_infer is not None


@pytest.mark.parametrize("padded", [_exact, _off], ids=["padding-serves", "dynamic-serves"])
def test_refit_checks_a_path_that_serves_nothing_once_at_the_smallest_shape(padded: Callable[..., Any]) -> None:
    """code_unchanged (refit: same libraries, new parameters): the idle dynamic library runs one sample at min,
    not one per shape; once it serves (the padding trick failed), it gets the full check as at compile."""
    shapes: list[tuple[int, ...]] = []

    def dynamic(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        shapes.append(feeds["x"].shape)
        return _exact(feeds)

    runner = StandIn(required={"dynamic": dynamic}, tricks={"padded": padded})
    result = gate_runner(runner, _reference(), "value", "categorical", TOL, variant_samples=4, facts=BUILDS,
                         code_unchanged=True)
    assert result.passed
    if padded is _exact:
        assert result.serving == "padded" and shapes == [SHAPES["min"]]
    else:
        assert result.serving == "dynamic" and runner.calls["dynamic"] == 2 * 4 and SHAPES["max"] in shapes


@pytest.mark.parametrize("trick", [_off, _raises], ids=["fails", "raises"])
def test_a_trick_that_fails_is_recorded_and_turned_off_not_the_artifact(trick: Callable[..., Any]) -> None:
    runner = StandIn(required={"dynamic": _exact}, tricks={"padded": trick})
    result = gate_runner(runner, _reference(), "value", "categorical", TOL, variant_samples=4, facts=BUILDS)
    assert result.passed
    assert result.variant_parity["padded"]["passed"] is False
    if trick is _raises:
        assert result.variant_parity["padded"] == {"passed": False, "error": "RuntimeError: boom"}
    assert result.serving == "dynamic" and runner.calls["dynamic"] == 2 * 4, "the dynamic library serves: full check"


def test_a_required_path_that_fails_fails_the_gate_with_its_parity() -> None:
    runner = StandIn(required={"dynamic": _off})
    result = gate_runner(runner, _reference(), "value", "categorical", TOL, variant_samples=4)
    assert not result.passed and result.failed_variant == "dynamic"
    assert result.parity is not None and result.parity.max_abs == pytest.approx(1.0)
    assert result.failure("net/tvm") == f"net/tvm (dynamic): parity failed: {OFF_BY_ONE}"
    assert result.variant_parity["dynamic"]["passed"] is False


def test_a_required_path_that_raises_fails_the_gate_naming_it() -> None:
    runner = StandIn(required={"dynamic": _raises})
    result = gate_runner(runner, _reference(), "value", "categorical", TOL, variant_samples=4)
    assert not result.passed and result.failed_variant == "dynamic" and result.error == "RuntimeError: boom"
    assert result.failure("policy/tvm-llvm.so") == "policy/tvm-llvm.so (dynamic): running the artifact raised " \
        "RuntimeError: boom"
    assert result.variant_parity["dynamic"] == {"passed": False, "error": "RuntimeError: boom"}


def test_the_main_path_failing_or_raising_stops_the_gate_before_any_variant() -> None:
    failing = StandIn(main=_off, required={"dynamic": _exact}, tricks={"padded": _exact})
    result = gate_runner(failing, _reference(), "value", "categorical", TOL, variant_samples=4)
    assert result.failure("n/b") == f"n/b: parity failed: {OFF_BY_ONE}" and result.variant_parity == {}
    assert set(failing.calls) == {"main"}
    raising = gate_runner(StandIn(main=_raises), _reference(), "value", "categorical", TOL, variant_samples=4)
    assert raising.parity is None and raising.error == "RuntimeError: boom"
    assert raising.failure("n/b") == "n/b: running the artifact raised RuntimeError: boom"


def test_verify_mode_checks_every_sample_and_only_the_tricks_the_manifest_trusts() -> None:
    runner = StandIn(required={"dynamic": _exact}, tricks={"padded": _off, "other": _exact})
    result = gate_runner(runner, _reference(), "value", "categorical", TOL, variant_samples=None, facts=BUILDS,
                         trusted=lambda name: name == "other")
    assert result.passed and "padded" not in runner.calls
    assert runner.calls["other"] == 2 * SAMPLES and runner.calls["dynamic"] == 2 * SAMPLES
    trusted_but_broken = gate_runner(StandIn(tricks={"padded": _off}), _reference(), "value", "categorical", TOL,
                                     variant_samples=None, trusted=lambda name: True)
    assert trusted_but_broken.failure("n/tvm") == f"n/tvm (padded): parity failed: {OFF_BY_ONE}"
