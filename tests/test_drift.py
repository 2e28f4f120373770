"""rlopt.drift on hand-computed cases: a masked policy's KL and argmax, and the element-wise differences."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlopt.drift import Difference, drift


def test_a_masked_policy_is_compared_over_the_actions_the_old_one_can_take() -> None:
    inf = np.inf
    old = [np.array([[0.0, 0.0, -inf], [-inf, 1.0, 0.0]], np.float32)]
    new = [np.array([[math.log(3.0), 0.0, 5.0], [-inf, 0.0, 1.0]], np.float32)]
    kl, agree = drift(old, new, "categorical")
    # row 0 over actions 0 and 1 (the third is masked in the old policy): as the unmasked [0, 0] vs [ln 3, 0]
    assert kl[0] == pytest.approx(0.5 * math.log(4 / 3), rel=1e-6)
    p = 1 / (1 + math.exp(-1))  # row 1: softmax([1, 0]) against its mirror, over actions 1 and 2
    assert kl[1] == pytest.approx((p - (1 - p)) * 1, rel=1e-6)
    assert agree is not None and agree.tolist() == [True, False]  # row 0's argmax over the legal two: action 0


def test_a_new_policy_that_masks_a_legal_action_drifts_infinitely() -> None:
    kl, _ = drift([np.array([[0.0, 0.0]])], [np.array([[0.0, -np.inf]])], "categorical")
    assert kl[0] == np.inf


def test_difference_by_hand() -> None:
    difference = Difference()
    difference.add([np.array([1.0, -2.0, 0.0]), np.array([[4.0]])], [np.array([1.5, -2.0, 0.0]), np.array([[3.0]])])
    assert difference.max_abs == 1.0 and difference.max_rel == pytest.approx(0.5)
    assert difference.relative_error == pytest.approx(math.sqrt((0.25 + 1.0) / (1 + 4 + 16)))
    difference.add([np.array([0.0])], [np.array([2.0])])  # from zero: no relative figure, an absolute one
    assert difference.max_rel == pytest.approx(0.5) and difference.max_abs == 2.0


def test_difference_of_identical_outputs_is_zero_and_non_finite_mismatches_are_infinite() -> None:
    same = Difference()
    same.add([np.array([np.inf, 1.0])], [np.array([np.inf, 1.0])])
    assert (same.max_abs, same.max_rel, same.relative_error) == (0.0, 0.0, 0.0)
    apart = Difference()
    apart.add([np.array([np.nan, 1.0])], [np.array([0.0, 1.0])])
    assert apart.max_abs == np.inf and apart.max_rel == np.inf
