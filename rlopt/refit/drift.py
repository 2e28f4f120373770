"""Policy drift between the served weights and new ones: KL(old || new) and argmax agreement per row.

Both policies are compared on the same recorded reference inputs (reference.npz is recorded from a seed, so
the old and the new MODEL_DIR hold the same inputs), from the outputs PyTorch produced for each.
"""

from __future__ import annotations

import numpy as np

from rlopt.drift import drift, rows
from rlopt.manifest import Drift
from rlopt.reference import Reference


def reference_drift(old: Reference, new: Reference, distribution: str) -> Drift:
    """Drift over every recorded sample at every point of two references, a point's samples in one stacked call."""
    kls: list[np.ndarray] = []
    agree: list[np.ndarray] = []
    for point in [p for p in old.points if p in new.points]:
        count = min(old.samples(point), new.samples(point))
        same = np.ones(count, dtype=bool)
        for name in old.input_names:
            before, after = (r.arrays[f"{point}:in:{name}"][:count] for r in (old, new))
            if before.shape != after.shape:
                same[:] = False
                break
            same &= (before == after).reshape(count, -1).all(axis=1)  # a rollout observation: no drift to measure
        if not same.any():
            continue
        kl, agrees = drift(_kept(old, point, count, same), _kept(new, point, count, same), distribution)
        kls.append(kl)
        if agrees is not None:
            agree.append(agrees)
    every = np.concatenate(kls) if kls else np.zeros(0)
    return Drift(kl_mean=float(every.mean()) if every.size else 0.0, kl_max=float(every.max()) if every.size else 0.0,
                 argmax_agree=float(np.concatenate(agree).mean()) if agree else None, compared=int(every.size))


def _kept(reference: Reference, point: str, count: int, same: np.ndarray) -> list[np.ndarray]:
    """The outputs of the first `count` samples where `same`, stacked, each broadcast per sample to the first
    output's sample shape (as `rows` does for one sample)."""
    first = reference.arrays[f"{point}:out:{reference.output_names[0]}"].shape
    heads = [reference.arrays[f"{point}:out:{name}"][:count][same] for name in reference.output_names]
    return [np.broadcast_to(h.reshape(h.shape[:1] + (1,) * (len(first) - h.ndim) + h.shape[1:]),
                            h.shape[:1] + tuple(first[1:])) for h in heads]


__all__ = ["drift", "reference_drift", "rows"]
