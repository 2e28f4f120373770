"""The `rlopt warmup` report (what --json prints and reports/warmup-<profile>.json holds), and the live status."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel

from rlopt.tools.report import ToolReport


class LatencySummary(BaseModel):
    count: int
    p50_ms: float
    p95_ms: float
    p99_ms: float
    max_ms: float


class ShapeReport(BaseModel):
    label: str
    shapes: dict[str, list[int]]
    share: float
    count: int
    first_call_ms: float
    throughput_rps: float
    steady_reached: bool
    time_to_steady_s: float | None
    final_window_p99_ms: float | None
    before_steady: LatencySummary | None
    after_steady: LatencySummary | None
    note: str = ""


class Divergence(BaseModel):
    thread: int
    probe: str
    output: str
    max_abs: float
    at_s: float


class ConsistencyReport(BaseModel):
    passed: bool
    atol: float
    probes: list[str]
    compared: int
    max_abs_diff: float
    divergences: list[Divergence]
    request_errors: list[str]
    detail: str


class SloReport(BaseModel):
    p99_ms: float
    measured_p99_ms: float | None
    basis: str
    passed: bool


class WarmupReport(ToolReport):
    kind: str = "rlopt-warmup"
    profile: str
    profile_name: str
    network: str
    backend: str
    duration_s: float
    elapsed_s: float
    concurrency: int
    interrupted: bool
    load_ms: float
    time_to_steady_s: float | None
    steady_state: str
    requests: int
    throughput_rps: float
    shapes: list[ShapeReport]
    consistency: ConsistencyReport
    slo: SloReport | None
    passed: bool
    failures: list[str]
    machine: dict[str, Any]
    warnings: list[str] = []
    files: dict[str, str]
    url: str | None = None  # `--url`: the server the requests went to (else they ran in this process)


@dataclass
class LiveShape:
    label: str
    count: int
    first_call_ms: float | None
    p50_ms: float | None
    p99_ms: float | None


@dataclass
class LiveStatus:
    phase: str
    network: str
    backend: str
    elapsed_s: float
    duration_s: float
    concurrency: int
    requests: int
    probes: int
    divergences: int
    shapes: list[LiveShape]


Monitor = Callable[[LiveStatus], None]


__all__ = ["ConsistencyReport", "Divergence", "LatencySummary", "LiveShape", "LiveStatus", "Monitor", "ShapeReport",
           "SloReport", "WarmupReport"]
