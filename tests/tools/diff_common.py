"""Helpers of the `rlopt diff` tests: the tiny recipe's variants and timers that read no clock.

Timings in these tests are injected (`run_diff(..., timer=...)`): `scaled_timer` gives each side fixed per-round
medians, `graph_bytes_timer` makes latency proportional to the ONNX graph's size times the rows of a call, a
deterministic stand-in for the clock under which a wider network is slower, as it is on a CPU.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from rlopt.manifest import checked_file, read_manifest
from rlopt.tools.bench.candidates import load_reference
from rlopt.tools.diff.compare import NEW, NEW_TWIN, OLD, OLD_TWIN, NetworkTiming
from tests.conftest import tiny_recipe_text

ROUNDS = 20


def tiny_variant(backends: str = "[onnxruntime]", *, width: int = 16, seed: int = 3) -> str:
    """The tiny recipe (tests/conftest.py) with another hidden width or weight seed: the same interface."""
    text = tiny_recipe_text(backends)
    return text.replace("width: 16", f"width: {width}").replace("seed: 3", f"seed: {seed}")


def rounds_of(old_us: float, new_us: float, jitter: float = 0.01) -> dict[str, list[float]]:
    """Per-round medians of the four copies: each side alternates +-jitter around its figure, twins out of phase."""
    def series(value: float, phase: int) -> list[float]:
        return [value * (1 + jitter * (-1) ** (i + phase)) for i in range(ROUNDS)]

    return {OLD: series(old_us, 0), OLD_TWIN: series(old_us, 1), NEW: series(new_us, 0), NEW_TWIN: series(new_us, 1)}


def scaled_timer(ratios: Mapping[tuple[str, str], float] | None = None, calls: list[tuple[str, tuple[str, ...]]]
                 | None = None) -> Callable[..., NetworkTiming]:
    """NEW is `ratios[(network, point)]` times OLD (default 1); records (network, points) per call in `calls`."""
    def timer(old_dir: Path, new_dir: Path, network: str, points: Sequence[str], budget_s: float,
              seed: Sequence[int], progress: Callable[[str], None]) -> NetworkTiming:
        if calls is not None:
            calls.append((network, tuple(points)))
        return NetworkTiming(rounds={p: rounds_of(100.0, 100.0 * (ratios or {}).get((network, p), 1.0))
                                     for p in points})

    return timer


def _cost(model_dir: Path, network: str, point: str) -> float:
    record = read_manifest(model_dir).networks[network]
    graph = checked_file(model_dir, record.files["model.onnx"]).stat().st_size
    shape = load_reference(model_dir, record).shape(point)
    rows = math.prod(next(iter(shape.values()))[:-1])  # every dim but the features: the rows a call computes
    return graph * rows / 1e4


def graph_bytes_timer(old_dir: Path, new_dir: Path, network: str, points: Sequence[str], budget_s: float,
                      seed: Sequence[int], progress: Callable[[str], None]) -> NetworkTiming:
    """Latency = the ONNX graph's bytes x the rows of a call (see the module docstring)."""
    return NetworkTiming(rounds={p: rounds_of(_cost(old_dir, network, p), _cost(new_dir, network, p)) for p in points})
