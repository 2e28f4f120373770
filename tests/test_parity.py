"""Parity metrics by network kind; 'nothing compared' fails."""

from __future__ import annotations

import numpy as np

from rlopt.parity import ParityAccumulator, Tolerance, categorical_kl, gaussian_kl

TOL = Tolerance(atol=1e-4, rtol=1e-3, max_kl=1e-4)


def test_categorical_kl_is_zero_for_equal_and_positive_otherwise() -> None:
    logits = np.array([[1.0, 2.0, 3.0], [0.0, 0.0, 5.0]])
    assert np.allclose(categorical_kl(logits, logits), 0)
    shifted = logits + np.array([0.0, 0.0, 0.5])
    assert (categorical_kl(logits, shifted) > 0).all()
    assert np.allclose(categorical_kl(logits, logits + 7.0), 0), "softmax is shift invariant"


def test_gaussian_kl_matches_closed_form() -> None:
    kl = gaussian_kl(np.zeros((1, 1)), np.zeros(1), np.ones((1, 1)), np.zeros(1))
    assert np.allclose(kl, 0.5)


def test_policy_passes_within_tolerance_and_fails_outside() -> None:
    ref = np.random.default_rng(0).standard_normal((4, 6)).astype(np.float32)
    ok = ParityAccumulator("policy", "categorical", ["logits"], TOL)
    ok.add([ref], [ref + 1e-6])
    result = ok.result()
    assert result.passed and result.argmax_agree == 1.0 and result.kl is not None and result.compared == 1

    bad = ParityAccumulator("policy", "categorical", ["logits"], TOL)
    bad.add([ref], [ref + np.where(np.arange(6) == 0, 0.3, 0.0)])
    result = bad.result()
    assert not result.passed
    out = result.outputs[0]
    assert out.needed_atol > 0.29 and out.max_abs > 0.29 and out.kl > TOL.max_kl


def test_argmax_flip_on_a_tie_is_tolerated_but_not_elsewhere() -> None:
    tie = np.array([[1.0, 1.0, -3.0]], dtype=np.float32)
    acc = ParityAccumulator("policy", "categorical", ["logits"], Tolerance(1e-3, 0, 1.0))
    acc.add([tie], [tie + np.array([0.0, 1e-5, 0.0], dtype=np.float32)])
    assert acc.result().passed and acc.result().argmax_agree == 0.0


def test_value_and_generic_use_atol_rtol_on_every_output() -> None:
    ref = [np.ones((2, 1), np.float32), np.zeros((2, 3), np.float32)]
    acc = ParityAccumulator("generic", "categorical", ["a", "b"], TOL)
    acc.add(ref, [ref[0], ref[1] + 1e-2])
    result = acc.result()
    assert not result.passed and result.outputs[0].passed and not result.outputs[1].passed
    assert result.kl is None


def test_shape_mismatch_nan_and_count_mismatch_fail() -> None:
    ref = [np.ones((2, 1), np.float32)]
    for out in ([np.ones((1, 1), np.float32)], [np.full((2, 1), np.nan, np.float32)], []):
        acc = ParityAccumulator("value", "categorical", ["v"], TOL)
        acc.add(ref, out)
        assert not acc.result().passed


def test_nothing_compared_fails() -> None:
    assert not ParityAccumulator("value", "categorical", ["v"], TOL).result().passed


def test_integer_outputs_compare_exactly() -> None:
    acc = ParityAccumulator("generic", "categorical", ["action"], TOL)
    acc.add([np.array([1, 2])], [np.array([1, 3])])
    assert not acc.result().passed


# contract section 7: infinities, NaN, masked policies, ties

NEG = -np.inf


def _one(kind: str, ref: np.ndarray, out: np.ndarray, tol: Tolerance = TOL, name: str = "logits"):
    acc = ParityAccumulator(kind, "categorical", [name], tol)
    acc.add([ref], [out])
    return acc.result()


def test_masked_logits_pass_when_equal_and_kl_argmax_use_legal_actions_only() -> None:
    ref = np.array([[NEG, 1.0, 2.0, NEG], [0.5, NEG, NEG, NEG]], dtype=np.float32)
    result = _one("policy", ref, ref + np.array([0, 0, 1e-6, 0], dtype=np.float32))
    assert result.passed, result.outputs[0].reason
    assert result.argmax_agree == 1.0 and result.kl is not None and result.kl < 1e-9
    assert np.isfinite(result.max_abs)


def test_fully_masked_row_is_compared_elementwise_only() -> None:
    ref = np.full((2, 3), NEG, dtype=np.float32)
    ref[0, 1] = 0.0
    assert _one("policy", ref, ref.copy()).passed


def test_minus_inf_against_a_number_fails() -> None:
    ref = np.array([[NEG, 1.0, 2.0]], dtype=np.float32)
    out = np.array([[-1e9, 1.0, 2.0]], dtype=np.float32)
    for kind in ("policy", "value", "generic"):
        result = _one(kind, ref, out)
        assert not result.passed, kind
        assert "infinities must match" in result.outputs[0].reason
    # and the other way round: a masked output where PyTorch gives a number
    assert not _one("policy", out, ref).passed


def test_plus_inf_against_minus_inf_fails_and_equal_infinities_pass() -> None:
    ref = np.array([[np.inf, 1.0]], dtype=np.float32)
    assert not _one("value", ref, np.array([[NEG, 1.0]], dtype=np.float32)).passed
    assert _one("value", ref, ref.copy()).passed


def test_nan_in_the_reference_fails_naming_the_output() -> None:
    ref = np.array([[np.nan, 1.0]], dtype=np.float32)
    for out in (ref.copy(), np.array([[0.0, 1.0]], dtype=np.float32)):
        for kind in ("policy", "value", "generic"):
            result = _one(kind, ref, out, name="q_values")
            assert not result.passed, (kind, out)
            assert "'q_values'" in result.outputs[0].reason and "NaN" in result.outputs[0].reason


def test_identical_nan_fails_for_value_networks() -> None:
    ref = np.full((2, 1), np.nan, np.float32)
    acc = ParityAccumulator("value", "categorical", ["v"], TOL)
    acc.add([ref], [ref.copy()])
    result = acc.result()
    assert not result.passed and "NaN" in result.outputs[0].reason


def test_nan_in_the_output_where_the_reference_is_finite_fails() -> None:
    ref = np.array([[0.0, 1.0]], dtype=np.float32)
    result = _one("generic", ref, np.array([[np.nan, 1.0]], dtype=np.float32), name="a")
    assert not result.passed and "is NaN" in result.outputs[0].reason and result.max_abs == np.inf


def test_argmax_tie_within_atol_is_not_a_flip_but_a_gap_over_atol_is() -> None:
    loose_kl = Tolerance(atol=1e-3, rtol=1e-3, max_kl=1.0)
    tie = np.array([[2.0, 2.0 + 5e-4, -3.0]], dtype=np.float32)  # top two 5e-4 apart: within atol
    result = _one("policy", tie, tie[:, [1, 0, 2]].copy(), loose_kl)  # swapped: argmax flips
    assert result.argmax_agree == 0.0
    assert result.passed, result.outputs[0].reason  # every value within atol, and the flip is a tie
    # top two 2.5e-3 apart: more than atol (though less than atol + rtol*|top|, the old rule's tie)
    apart = np.array([[2.0, 2.0 + 2.5e-3, -3.0]], dtype=np.float32)
    flipped = apart + np.array([[5e-3, 0.0, 0.0]], dtype=np.float32)  # within atol + rtol*|ref| elementwise
    result = _one("policy", apart, flipped, Tolerance(atol=1e-3, rtol=3e-3, max_kl=1.0))
    assert result.argmax_agree == 0.0 and not result.passed
    assert "argmax" in result.outputs[0].reason


def test_boolean_outputs_compare_exactly() -> None:
    ref = np.array([[True, False]])
    assert _one("generic", ref, ref.copy()).passed
    assert not _one("generic", ref, ~ref).passed


class _SteppedReference:
    """A stand-in Reference with recurrent state h -> h_new: PyTorch's rule is h_new = h + x."""

    def __init__(self, steps: int = 3, samples: int = 2) -> None:
        rng = np.random.default_rng(0)
        self.input_names, self.output_names = ["x", "h"], ["y", "h_new"]
        self.state = {"h": "h_new"}
        self._steps, self._samples = steps, samples
        self.xs = rng.standard_normal((steps, samples, 1, 3)).astype(np.float32)
        self.h0 = rng.standard_normal((samples, 1, 3)).astype(np.float32)
        self.points = ["opt"]

    def shape(self, point: str) -> dict[str, list[int]]:
        return {"x": [1, 3], "h": [1, 3]}

    def samples(self, point: str) -> int:
        return self._samples

    def steps(self, point: str) -> int:
        return self._steps

    def _h(self, sample: int, step: int) -> np.ndarray:
        return self.h0[sample] + self.xs[:step, sample].sum(axis=0)

    def feeds(self, point: str, sample: int) -> dict[str, np.ndarray]:
        return {"x": self.xs[0, sample], "h": self.h0[sample]}

    def step_feeds(self, point: str, sample: int, step: int) -> dict[str, np.ndarray]:
        return {"x": self.xs[step, sample], "h": self._h(sample, step)}

    def outputs(self, point: str, sample: int) -> list[np.ndarray]:
        return self.step_outputs(point, sample, 0)

    def step_outputs(self, point: str, sample: int, step: int) -> list[np.ndarray]:
        h_new = self._h(sample, step + 1)
        return [h_new * 2, h_new]


def test_multi_step_parity_feeds_the_backends_own_state_back() -> None:
    from rlopt.parity import run_parity

    reference = _SteppedReference()
    seen: list[np.ndarray] = []

    def exact(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        seen.append(feeds["h"])
        h_new = feeds["h"] + feeds["x"]
        return [h_new * 2, h_new]

    result = run_parity(exact, reference, "generic", "categorical", TOL)
    assert result.passed and result.compared == 3 * 2
    assert len(seen) == 6

    def drifting(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        h_new = feeds["h"] + feeds["x"] + 1e-3  # small per step, fed back: grows with the steps
        return [h_new * 2, h_new]

    result = run_parity(drifting, reference, "generic", "categorical", Tolerance(2.5e-3, 0, 1.0))
    assert not result.passed
    first_step_only = run_parity(drifting, _SteppedReference(steps=1), "generic", "categorical",
                                 Tolerance(2.5e-3, 0, 1.0))
    assert first_step_only.passed, "one step alone stays inside atol; the fed-back state is what fails"
