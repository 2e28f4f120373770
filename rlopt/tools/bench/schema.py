"""The `rlopt bench` report (what --json prints): per network, per profile shape, one row per candidate."""

from __future__ import annotations

from typing import Any

from pydantic import Field, BaseModel

from rlopt.tools.report import ToolReport


class CandidateResult(BaseModel):
    candidate: str
    group: str
    median_us: float
    p99_us: float
    mean_us: float
    calls: int
    ratio_to_ort_best: float | None
    gflops_per_s: float | None
    first_call_ms: float


class ShapeBench(BaseModel):
    point: str
    shape: dict[str, list[int]]
    gflop: float | None
    rounds: int
    ort_best: str | None
    results: list[CandidateResult]
    round_medians_us: dict[str, list[float]] = {}  # per candidate, its block's median in each interleaved round


class Skip(BaseModel):
    candidate: str
    reason: str


class WorkerInfo(BaseModel):
    """The process a candidate ran in: its own pid, the threads it computes with, the cores it may use."""

    pid: int
    threads: int | None = None
    backend: str | None = None  # for rlopt candidates: the backend the Session runs (what `auto` resolved to)
    cores: list[int] = []


class NetworkBench(BaseModel):
    network: str
    eager_source: str | None
    candidates: dict[str, str]
    skipped: list[Skip]
    shapes: list[ShapeBench]
    workers: dict[str, WorkerInfo] = {}


class BenchReport(ToolReport):
    kind: str = "rlopt-bench"
    budget_s: float
    method: str
    seed: int | None = Field(None, description="the seed the rounds' order came from (run_bench's `seed`)")
    isolation: str = "process"
    machine: dict[str, Any]
    versions: dict[str, str | None]
    networks: list[NetworkBench]
    warnings: list[str] = []


__all__ = ["BenchReport", "CandidateResult", "NetworkBench", "ShapeBench", "Skip", "WorkerInfo"]
