"""Drift: how far NEW_DIR's served outputs moved from OLD_DIR's, on the recorded reference inputs.

Both MODEL_DIRs run through the runtime as a user's code would (`rlopt.load(..., backend="auto")`), on every
sample at every named shape of NEW_DIR's reference.npz (the inputs a compile records come from `verify.seed`, so
two compiles of one interface hold the same ones). A recurrent network is compared on each sample's first step.
The figure follows the network's kind (rlopt.drift): policy KL(old || new) per row and argmax agreement, value
the relative error ||new - old|| / ||old||, generic the largest absolute difference.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from rlopt.drift import Difference, drift
from rlopt.manifest import NetworkRecord
from rlopt.reference import Reference
from rlopt.tools.bench.analysis import profile_points
from rlopt.tools.diff.schema import DriftResult


def network_drift(old_dir: Path, new_dir: Path, network: str, record: NetworkRecord,
                  reference: Reference) -> DriftResult:
    """Run both MODEL_DIRs' `auto` sessions on `reference`'s inputs and compare their outputs (`record`: NEW_DIR's)."""
    from rlopt.runtime import load

    old = load(old_dir, network, "auto")
    try:
        new = load(new_dir, network, "auto")
    except BaseException:
        old.close()
        raise
    kls: list[np.ndarray] = []
    agree: list[np.ndarray] = []
    difference = Difference()
    compared = 0
    try:
        for point in profile_points(reference):
            for index in range(reference.samples(point)):
                feeds = reference.feeds(point, index)
                before, after = old.run(feeds), new.run(feeds)
                outputs_old = [before[name] for name in record.outputs]
                outputs_new = [after[name] for name in record.outputs]
                difference.add(outputs_old, outputs_new)
                if record.kind == "policy":
                    kl, agrees = drift(outputs_old, outputs_new, record.distribution)
                    kls.append(kl)
                    if agrees is not None:
                        agree.append(agrees)
                compared += 1
    finally:
        old.close()
        new.close()
    kl_rows = np.concatenate(kls) if kls else None
    result = DriftResult(metric="max_abs", value=difference.max_abs, max_abs=difference.max_abs,
                         max_rel=difference.max_rel, relative_error=difference.relative_error, compared=compared)
    if record.kind == "policy" and kl_rows is not None and kl_rows.size:
        result.metric, result.value = "kl", float(kl_rows.mean())
        result.kl_mean, result.kl_max = float(kl_rows.mean()), float(kl_rows.max())
        result.argmax_agree = float(np.concatenate(agree).mean()) if agree else None
    elif record.kind == "value":
        result.metric, result.value = "relative_error", difference.relative_error
    return result


__all__ = ["network_drift"]
