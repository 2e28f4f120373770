"""Interleaved rounds of timed blocks: how `auto`'s measurement times its configurations in this process.

A configuration is a set of (subject, shape label) cells, each a call through a Session (the runtime's own path).
`apart.py` runs the same rounds with each subject in a worker process of its own.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np

from rlopt.backends import Runner, open_runner
from rlopt.manifest import NetworkRecord
from rlopt.reference import Reference
from rlopt.runtime import Session, unbucketed_variant
from rlopt.runtime.routes import OTHER, Table
from rlopt.timing import warm_until_steady

ROUNDS = 15
BURST_CALLS = 7  # timed calls per (backend, shape) block after one untimed: the bench protocol's block of 8
CELL_BUDGET_S = 0.005  # ... fewer where that many would take longer than this (at least one)
GAP_S = 0.001  # idle before each block: a bench worker is woken for its block, a serving loop calls between steps
SETTLE_S = 0.005  # pause between configurations, so the pools of the last one stop spinning first
BUDGET_S = 3.0  # no measuring round starts after this long (a heavy network on a busy machine gets fewer rounds)
WARM_CAP_S = 1.0  # the most one cell is warmed before the rounds
Call = Callable[[], object]
Cells = dict[tuple[str, str], Call]


def session_calls(runner: Runner, name: str, record: NetworkRecord, reference: Reference,
                  labels: dict[str, str]) -> dict[str, Call]:
    """A call per shape label through a Session (the runtime's own path, bound calls included); OTHER is the path
    that serves shapes without their own build, at opt."""
    session = Session({name: runner}, {}, name, name, record)
    calls: dict[str, Call] = {label: (lambda f=reference.feeds(p, 0): session.run(f)) for label, p in labels.items()
                              if label != OTHER}
    if OTHER in labels:
        feeds = reference.feeds(labels[OTHER], 0)
        variant = unbucketed_variant(name, record.artifacts[name].facts)
        infer = {**runner.parity_variants(), **runner.gated_variants()}.get(variant) if variant else None
        calls[OTHER] = (lambda: infer(feeds)) if infer is not None else (lambda: session.run(feeds))
    return calls


def subject_cells(key: str, runner: Runner, backend: str, record: NetworkRecord, reference: Reference,
                  labels: dict[str, str]) -> Cells:
    """`session_calls` as the cells of subject `key`: one (key, shape label) cell per label."""
    return {(key, label): call for label, call in session_calls(runner, backend, record, reference, labels).items()}


def timed_calls(call: Call, count: int) -> tuple[list[float], list[float]]:
    """`count` timed calls after an untimed one (a single call longer than a whole block's budget is not worth
    doubling): each call's wall time and the calling thread's CPU time, us."""
    if count > 1:
        call()
    walls, cpus = [], []
    for _ in range(count):
        cpu = time.thread_time_ns()
        start = time.perf_counter_ns()
        call()
        walls.append((time.perf_counter_ns() - start) / 1e3)
        cpus.append((time.thread_time_ns() - cpu) / 1e3)
    return walls, cpus


def timed_block(call: Call, count: int) -> tuple[float, float]:
    """Median of `count` timed calls (`timed_calls`), and the median of the calling thread's CPU time per call, both
    in us. The CPU time does not count the time this thread waited for a core: for a call that computes on the
    calling thread alone it is what the call costs whatever else runs on the machine (the median, as the wall
    figure's: a block's mean counted the first call after the idle gap, whose cold caches cost a 19 us TVM call
    36 us)."""
    walls, cpus = timed_calls(call, count)
    return float(np.median(walls)), float(np.median(cpus))


def block_median(call: Call, count: int) -> float:
    """`timed_block`'s median."""
    return timed_block(call, count)[0]


def block_counts(cells: Cells, estimates_us: Table | None = None) -> dict[tuple[str, str], int]:
    """Each cell warmed until steady (a fresh runner's first calls are not its speed: a JIT specializing, a pool
    starting; a Session binds its per-thread call on the second call of a signature), then its timed calls per
    block: BURST_CALLS, fewer where they would take longer than CELL_BUDGET_S (`estimates_us[subject][label]`, else
    one timed call), at least one."""
    counts = {}
    for cell, call in cells.items():
        warm_until_steady(call, cap_s=WARM_CAP_S, clock=time.perf_counter_ns)
        known = (estimates_us or {}).get(cell[0], {}).get(cell[1])
        estimate = float(known) if known else block_median(call, 1)
        counts[cell] = int(min(BURST_CALLS, max(1, CELL_BUDGET_S * 1e6 / max(estimate, 1.0))))
    return counts


class Block(NamedTuple):
    """One timed block of a cell: the median wall and CPU time per call and every call's wall time, us."""

    wall: float
    cpu: float
    calls: list[float]


def one_round(cells: Cells, counts: dict[tuple[str, str], int], rng: random.Random) -> dict[tuple[str, str], Block]:
    """One block per cell in shuffled order, each after GAP_S idle."""
    timed = {}
    for cell in rng.sample(list(cells), len(cells)):
        time.sleep(GAP_S)
        walls, cpus = timed_calls(cells[cell], counts[cell])
        timed[cell] = Block(float(np.median(walls)), float(np.median(cpus)), walls)
    return timed


@dataclass
class Rounds:
    """What interleaved rounds over subjects gave, per subject key and shape label: each round's block median (wall
    and CPU) and every timed call's wall time (us), and the rounds done."""

    walls: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    cpus: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    calls: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    done: int = 0

    def medians(self, cpu: bool = False) -> Table:
        """The median over rounds of each block median (the bench's figure), per key and label."""
        samples = self.cpus if cpu else self.walls
        return {k: {label: round(float(np.median(v)), 2) for label, v in cells.items() if v}
                for k, cells in samples.items()}

    def p99(self) -> Table:
        """The 99th percentile of every timed call, per key and label."""
        return {k: {label: round(float(np.percentile(v, 99)), 2) for label, v in cells.items() if v}
                for k, cells in self.calls.items()}


RoundOf = Callable[[], dict[Any, Block]]  # one subject's blocks of one round, per shape label (or per cell)


def drive_rounds(subjects: dict[str, RoundOf], rounds: int = ROUNDS, budget_s: float = BUDGET_S,
                 min_rounds: int = 1, seed: int = 0) -> Rounds:
    """Rounds that visit every subject in shuffled order (`subjects[key]()` times one block per shape label): at
    least `min_rounds` (and one), at most `rounds`; no round past `min_rounds` starts once `budget_s` is spent."""
    rng = random.Random(seed)
    result = Rounds({k: {} for k in subjects}, {k: {} for k in subjects}, {k: {} for k in subjects})
    deadline = time.monotonic() + budget_s
    while result.done < rounds and (result.done < max(1, min_rounds) or time.monotonic() < deadline):
        for key in rng.sample(list(subjects), len(subjects)):
            for label, block in subjects[key]().items():
                result.walls[key].setdefault(label, []).append(block.wall)
                result.cpus[key].setdefault(label, []).append(block.cpu)
                result.calls[key].setdefault(label, []).extend(block.calls)
        result.done += 1
    return result


def configuration_rounds(configurations: dict[str, Cells], estimates_us: Table | None = None,
                         seed: int = 0) -> dict[str, RoundOf]:
    """Each configuration as one subject of `drive_rounds`: its cells' blocks in shuffled order (`one_round`, keyed
    by cell: in a mixed configuration, calls switch backends as a mixed session's do), then SETTLE_S, so that the
    pools of one configuration stop spinning before the next one's calls. Each cell warmed and its block size set
    first (`block_counts`).

    A block is the bench protocol's: after GAP_S idle, one untimed call and up to BURST_CALLS timed ones
    (`estimates_us[backend][shape]` cuts a slow call's block to CELL_BUDGET_S; default: one timed call per cell).
    The idle gap is why: calls back to back time a warm loop the bench never runs, and flatter a thread pool whose
    workers are still spinning from the last call."""
    rng = random.Random(seed)

    def round_of(cells: Cells) -> RoundOf:
        counts = block_counts(cells, estimates_us)

        def blocks() -> dict[Any, Block]:
            timed = one_round(cells, counts, rng)
            time.sleep(SETTLE_S)
            return dict(timed)
        return blocks

    return {config: round_of(cells) for config, cells in configurations.items()}


Subjects = dict[str, tuple[str, dict[str, Any]]]  # key -> (backend, facts it is opened with)


def open_subject(staging: Path, record: NetworkRecord, backend: str, facts: dict[str, Any]) -> Runner:
    """`backend`'s artifact of `record` (under `staging`) opened with `facts`."""
    artifact = record.artifacts[backend]
    assert artifact.path is not None
    return open_runner(backend, staging / artifact.path, list(record.inputs), facts)


class AloneSet:
    """Subjects opened alone (an `alone <key>` configuration each), kept open for several rounds (a worker's, or
    `alone_rounds`'); `close` closes every runner."""

    def __init__(self, staging: Path, record: NetworkRecord, reference: Reference, subjects: Subjects,
                 labels: dict[str, str]) -> None:
        self.subjects, self.labels = subjects, labels
        self.opened: list[Runner] = []
        self.configurations: dict[str, Cells] = {}
        try:
            for key, (backend, facts) in subjects.items():
                self.opened.append(open_subject(staging, record, backend, facts))
                self.configurations[f"alone {key}"] = subject_cells(key, self.opened[-1], backend, record, reference,
                                                                    labels)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for runner in self.opened:
            runner.close()
        self.opened, self.configurations = [], {}


def alone_rounds(staging: Path, record: NetworkRecord, reference: Reference, subjects: Subjects,
                 labels: dict[str, str], budget_s: float = BUDGET_S, rounds: int = ROUNDS,
                 min_rounds: int = 1) -> Rounds:
    """`drive_rounds` over the subjects opened alone in this process (`AloneSet`, closed after): what
    `apart.apart_rounds` does with a worker process per subject, for where workers are off."""
    opened = AloneSet(staging, record, reference, subjects, labels)
    try:
        rng = random.Random(0)

        def round_of(cells: Cells) -> RoundOf:
            counts = block_counts(cells)
            return lambda: {label: block for (_, label), block in one_round(cells, counts, rng).items()}

        timed = {k: round_of(opened.configurations[f"alone {k}"]) for k in subjects}
        return drive_rounds(timed, rounds, budget_s, min_rounds)
    finally:
        opened.close()


__all__ = ["BUDGET_S", "CELL_BUDGET_S", "ROUNDS", "SETTLE_S", "AloneSet", "Block", "Call", "Cells",
           "RoundOf", "Rounds", "Subjects", "alone_rounds", "block_counts", "block_median",
           "configuration_rounds", "drive_rounds", "one_round", "open_subject", "session_calls",
           "subject_cells", "timed_block", "timed_calls"]
