"""`rlopt diff OLD_DIR NEW_DIR`: is NEW_DIR a regression against OLD_DIR? (contract section 15)

Order: both MODEL_DIRs read and hash-checked, interfaces compared, thresholds read (every problem so far exits 2
before anything runs); then per network the selected routes timed (`latency`, worker processes), the drift measured
(`outputs`, in this process, after the workers are gone), everything compared (`compare`, pure), and the shapes
that read as regressions timed a second time to confirm them.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from pathlib import Path

from rlopt.errors import UsageError
from rlopt.manifest import NetworkRecord
from rlopt.reference import Reference
from rlopt.tools.bench.analysis import profile_points
from rlopt.tools.bench.candidates import load_reference
from rlopt.tools.bench.driver import DEFAULT_BUDGET_S
from rlopt.tools.diff.compare import compare_network, file_changes, manifest_files, one_sided, suspects
from rlopt.tools.diff.latency import METHOD, Timer, time_network
from rlopt.tools.diff.outputs import network_drift
from rlopt.tools.diff.pair import compared_networks, read_checked, read_thresholds
from rlopt.tools.diff.schema import DiffReport, NetworkDiff, Thresholds


def common_shapes(old: Reference, new: Reference) -> dict[str, dict[str, list[int]]]:
    """NEW_DIR's named shapes that OLD_DIR also recorded, under the same name: point -> input -> dims."""
    return {point: new.shape(point) for point in profile_points(new)
            if point in profile_points(old) and old.shape(point) == new.shape(point)}


def diff_network(old_dir: Path, new_dir: Path, name: str, old: NetworkRecord, new: NetworkRecord,
                 thresholds: Thresholds, budget_s: float, seed: Sequence[int], timer: Timer,
                 progress: Callable[[str], None]) -> NetworkDiff:
    reference = load_reference(new_dir, new)
    shapes = common_shapes(load_reference(old_dir, old), reference)
    timing = timer(old_dir, new_dir, name, list(shapes), budget_s, seed, progress)
    progress(f"{name}: drift on {sum(reference.samples(p) for p in profile_points(reference))} reference samples")
    drift = network_drift(old_dir, new_dir, name, new, reference)
    first = compare_network(name, old, new, shapes, timing, drift, thresholds)
    again = suspects(first)
    if not again:
        return first
    progress(f"{name}: {', '.join(again)} read slower: timing {'them' if len(again) > 1 else 'it'} again")
    confirm = timer(old_dir, new_dir, name, again, budget_s, (*seed, 1), progress)
    return compare_network(name, old, new, shapes, timing, drift, thresholds, confirm)


def run_diff(old_dir: Path | str, new_dir: Path | str, networks: Sequence[str] | None = None, *,
             max_latency_ratio: float | None = None, max_drift_kl: float | None = None,
             allow_dropped_backends: bool | None = None, budget_s: float = DEFAULT_BUDGET_S, seed: int | None = None,
             progress: Callable[[str], None] | None = None, timer: Timer | None = None) -> DiffReport:
    """Compare NEW_DIR with OLD_DIR (see the module docstring); the thresholds given here override NEW_DIR's `ci:`.

    `budget_s`: seconds of interleaved rounds per named shape. `seed` orders the rounds (default: a new one, in
    the report). `timer` measures the latencies (default `latency.time_network`; tests pass timings of their own).
    """
    old_dir, new_dir = Path(old_dir), Path(new_dir)
    if not budget_s > 0:
        raise UsageError(f"--budget {budget_s}: must be > 0 seconds per shape; fix: e.g. --budget 2")
    old, new = read_checked(old_dir), read_checked(new_dir)
    thresholds = read_thresholds(new_dir, new, {"max_latency_ratio": max_latency_ratio, "max_drift_kl": max_drift_kl,
                                                "allow_dropped_backends": allow_dropped_backends})
    names = compared_networks(old_dir, new_dir, old, new, networks)
    seed = secrets.randbits(31) if seed is None else int(seed)
    say = progress or (lambda _: None)
    results = []
    for index, name in enumerate(names):
        if name not in new.networks:
            results.append(one_sided(name, old.networks[name], "dropped"))
        elif name not in old.networks:
            results.append(one_sided(name, new.networks[name], "added"))
        else:
            results.append(diff_network(old_dir, new_dir, name, old.networks[name], new.networks[name], thresholds,
                                        budget_s, (seed, index), timer or time_network, say))
    regressions = [line for network in results for lines in network.regressions.values() for line in lines]
    return DiffReport(created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), model_dir=str(new_dir),
                      old_dir=str(old_dir), new_dir=str(new_dir), thresholds=thresholds, method=METHOD,
                      budget_s=budget_s, seed=seed, networks=results,
                      files=file_changes(manifest_files(old), manifest_files(new)), regressions=regressions)


__all__ = ["common_shapes", "diff_network", "run_diff"]
