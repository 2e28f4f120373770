"""How far one network's outputs moved from another's on the same inputs, by network kind.

Shared by `rlopt refit` (the old weights' recorded outputs against the new ones') and `rlopt diff` (two
MODEL_DIRs' served outputs). Pure numpy: which outputs to compare, and on which inputs, is the caller's.
policy: KL(old || new) per row and argmax agreement; value and generic: absolute and relative differences.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from rlopt.parity import categorical_kl, gaussian_kl, masked_argmax, masked_categorical_kl


def rows(outputs: list[np.ndarray], distribution: str) -> tuple[np.ndarray, ...]:
    """The policy's outputs as 2-D [rows, actions] arrays ([mean, log_std] for a gaussian)."""
    count = 2 if distribution == "gaussian" else 1
    heads = outputs[:count]
    return tuple(np.broadcast_to(h, heads[0].shape).reshape(-1, heads[0].shape[-1]) for h in heads)


def drift(old: list[np.ndarray], new: list[np.ndarray], distribution: str) -> tuple[np.ndarray, np.ndarray | None]:
    """Per row: KL(old || new), and whether the argmax agrees (categorical only, else None).

    Logits a mask set to -inf (or any non-finite logit of the old policy) are actions the old policy cannot take:
    KL and argmax are over the others, as parity counts a masked policy (contract section 8)."""
    before, after = rows(old, distribution), rows(new, distribution)
    if distribution == "gaussian":
        return gaussian_kl(before[0], before[1], after[0], after[1]), None
    if np.isfinite(before[0]).all():
        return categorical_kl(before[0], after[0]), before[0].argmax(-1) == after[0].argmax(-1)
    legal = np.isfinite(before[0])
    return (masked_categorical_kl(before[0], after[0], legal),
            masked_argmax(before[0], legal) == masked_argmax(after[0], legal))


@dataclass
class Difference:
    """Running element-wise differences of new against old over every output compared so far."""

    max_abs: float = 0.0
    max_rel: float = 0.0  # largest |new - old| / |old| where old is a finite number other than 0
    squared_diff: float = 0.0
    squared_old: float = 0.0

    def add(self, old: list[np.ndarray], new: list[np.ndarray]) -> None:
        for before, after in zip(old, new, strict=True):
            a, b = np.asarray(before, np.float64), np.asarray(after, np.float64)
            finite = np.isfinite(a) & np.isfinite(b)
            if not (np.isfinite(a) == np.isfinite(b)).all() or not (a[~finite] == b[~finite]).all():
                self.max_abs = self.max_rel = float("inf")  # an infinity or NaN where the other has something else
            diff = np.abs(a[finite] - b[finite])
            if diff.size:
                self.max_abs = max(self.max_abs, float(diff.max()))
                scale = np.abs(a[finite])
                nonzero = scale > 0
                if nonzero.any():  # where old is 0 a relative difference means nothing: max_abs holds it
                    self.max_rel = max(self.max_rel, float((diff[nonzero] / scale[nonzero]).max()))
            self.squared_diff += float(np.square(diff).sum())
            self.squared_old += float(np.square(a[finite]).sum())

    @property
    def relative_error(self) -> float:
        """||new - old|| / ||old|| over every finite element (0 when both are zero, inf when only old is)."""
        if self.squared_old == 0:
            return 0.0 if self.squared_diff == 0 else float("inf")
        return float(np.sqrt(self.squared_diff / self.squared_old))


__all__ = ["Difference", "drift", "rows"]
