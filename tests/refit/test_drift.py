"""Drift on hand-computed cases: categorical KL(old || new) and argmax agreement, gaussian KL."""

from __future__ import annotations

import math

import numpy as np
import pytest

from rlopt.refit.drift import drift, reference_drift
from rlopt.reference import Reference


def test_categorical_kl_and_argmax_by_hand() -> None:
    old = [np.array([[0.0, 0.0], [2.0, 0.0]], dtype=np.float32)]
    new = [np.array([[math.log(3.0), 0.0], [0.0, 2.0]], dtype=np.float32)]
    kl, agree = drift(old, new, "categorical")
    # row 0: p = [1/2, 1/2], q = [3/4, 1/4]: 1/2 ln(2/3) + 1/2 ln 2 = 1/2 ln(4/3)
    assert kl[0] == pytest.approx(0.5 * math.log(4 / 3), rel=1e-6)
    # row 1: p = softmax([2, 0]), q = its mirror: KL = (p0 - p1) * 2
    p0 = 1 / (1 + math.exp(-2))
    assert kl[1] == pytest.approx((p0 - (1 - p0)) * 2, rel=1e-6)
    assert agree is not None and agree.tolist() == [True, False]


def test_gaussian_kl_by_hand() -> None:
    old = [np.zeros((1, 2), np.float32), np.zeros((1, 2), np.float32)]
    new = [np.array([[1.0, 0.0]], np.float32), np.array([[0.0, math.log(2.0)]], np.float32)]
    kl, agree = drift(old, new, "gaussian")
    # dim 0: unit variances, means 1 apart: 1/2; dim 1: sigma 1 -> 2: ln 2 + 1/(2*4) - 1/2
    assert kl[0] == pytest.approx(0.5 + math.log(2) + 1 / 8 - 0.5, rel=1e-6)
    assert agree is None


def test_reference_drift_over_points() -> None:
    feeds = np.zeros((2, 1, 3), np.float32)
    old = Reference({"opt:in:x": feeds, "opt:out:logits": np.array([[[0.0, 0.0]], [[1.0, 0.0]]], np.float32)},
                    ["x"], ["logits"])
    new = Reference({"opt:in:x": feeds, "opt:out:logits": np.array([[[0.0, 0.0]], [[0.0, 1.0]]], np.float32)},
                    ["x"], ["logits"])
    result = reference_drift(old, new, "categorical")
    assert result.compared == 2
    assert result.argmax_agree == pytest.approx(0.5)
    assert result.kl_max > 0 and result.kl_mean == pytest.approx(result.kl_max / 2)


def test_reference_drift_skips_changed_inputs_and_broadcasts_a_shared_log_std() -> None:
    """Stacked per point, the result is the per-sample one: a sample whose input differs (a rollout observation)
    is left out, and a log_std recorded per sample as [actions] is broadcast to the mean's [rows, actions]."""
    rng = np.random.default_rng(0)
    feeds = rng.standard_normal((3, 2, 4)).astype(np.float32)
    moved = feeds.copy()
    moved[1, 0, 0] += 1.0
    means = [rng.standard_normal((3, 2, 2)).astype(np.float32) for _ in range(2)]
    log_stds = [rng.standard_normal((3, 2)).astype(np.float32) for _ in range(2)]
    old, new = (Reference({"opt:in:x": x, "opt:out:mean": m, "opt:out:log_std": s}, ["x"], ["mean", "log_std"])
                for x, m, s in zip((feeds, moved), means, log_stds))
    result = reference_drift(old, new, "gaussian")
    expected = np.concatenate([drift([means[0][i], log_stds[0][i]], [means[1][i], log_stds[1][i]], "gaussian")[0]
                               for i in (0, 2)])
    assert result.compared == 4 and result.argmax_agree is None
    assert result.kl_mean == pytest.approx(float(expected.mean()), rel=1e-12)
    assert result.kl_max == pytest.approx(float(expected.max()), rel=1e-12)
