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
