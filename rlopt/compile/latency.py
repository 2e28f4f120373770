"""The manifest's latencies: every verified backend of one network timed as `rlopt bench` times it (the `latency`
stage).

Each backend opened in a worker process of its own, through a Session as `rlopt.load(..., backend=B).run` calls
it, the workers frozen between their blocks and visited in shuffled order each round (`apart.apart_rounds`); per
named shape, p50 is the median of the rounds' block medians (the bench's figure) and p99 that of every timed call.
Timed in the compiling process, one backend after another and back to back, the manifest's p50 read 0.4-2.7x what
`rlopt bench` measured for the same artifact: this process holds every other backend's runtime and pools, and a
worker that runs alone keeps its caches warm, while the bench's and a caller's calls come between other work.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rlopt.backends import BACKENDS, stage_versions, unavailable_reason
from rlopt.compile import apart
from rlopt.compile.apart import apart_rounds
from rlopt.compile.rounds import Rounds, Subjects, alone_rounds
from rlopt.errors import first_line
from rlopt.machine import usable_cores
from rlopt.manifest import Latency, NetworkRecord
from rlopt.stages.base import Context, Stage, StageOutput, package_digest

# Rounds go on until the budget is spent (at least MIN_ROUNDS whatever it takes): this host's speed moves in phases
# of 0.25-1 s (a one-thread TVM call of 5 us read 4.9 or 9.3 us from one window to the next), and 15 rounds of a
# 10 us network took 0.15 s, all inside one phase, while the bench spreads its calls over seconds.
TIMING_BUDGET_S = 0.1  # per backend and named shape
MIN_ROUNDS, MAX_ROUNDS = 5, 400


def timed_backends(record: NetworkRecord) -> list[str]:
    """The backends whose latency the manifest records: verified and runnable here."""
    return [b for b, artifact in record.artifacts.items()
            if artifact.verified and artifact.path is not None and unavailable_reason(b, artifact.facts) is None]


def artifact_key(record: NetworkRecord, backend: str, identities: Mapping[str, Any]) -> dict[str, Any]:
    """What a measurement of `backend`'s artifact depends on, for a stage's cache key: its identity (its build's
    `artifact_identity`, else the sha256 of its file and companions), facts, runner code and library versions."""
    artifact = record.artifacts[backend]
    known = identities.get(backend)
    identity = known if known is not None else [artifact.sha256, *(f.sha256 for f in artifact.facts.companion_files())]
    return {"identity": identity, "facts": artifact.facts.as_dict(),
            "runner_code": package_digest(BACKENDS[backend].runner.split(":")[0]), "versions": stage_versions(backend)}


class TimeBackends(Stage):
    """Each verified backend's p50 / p99 at each named shape (`latency_us`). Cached: the key holds every timed
    artifact's identity and facts, the reference, the runtime's code, this CPU (`machine_dependent`) and its usable
    cores."""

    name, cached, machine_dependent = "latency", True, True
    helpers = ("rlopt.compile.apart", "rlopt.compile.rounds", "rlopt.runtime.routes", "rlopt.backends",
               "rlopt.backends.base", "rlopt.facts", "rlopt.timing", "rlopt.reference", "rlopt.arrays",
               "rlopt.onnx_session")

    def __init__(self, record: NetworkRecord, identities: dict[str, Any] | None = None) -> None:
        self.record, self.identities = record, dict(identities or {})

    def config(self, ctx: Context) -> Any:
        return {"artifacts": {b: artifact_key(self.record, b, self.identities) for b in timed_backends(self.record)},
                "inputs": {n: p.model_dump(mode="json") for n, p in self.record.inputs.items()},
                "reference": self.record.reference.sha256 if self.record.reference else None,
                "budget_s": TIMING_BUDGET_S, "cores": usable_cores(),
                "runtime": package_digest("rlopt.runtime.session")}

    def upstream(self, ctx: Context) -> dict[str, Any]:
        return {}

    def run(self, ctx: Context) -> StageOutput:
        record, reference = self.record, ctx.reference
        subjects: Subjects = {b: (b, record.artifacts[b].facts.as_dict()) for b in timed_backends(record)}
        labels = {point: point for point in reference.points}
        if not subjects or not labels:
            return StageOutput(None, {"latency_us": {}, "notice": None})
        budget_s = TIMING_BUDGET_S * len(subjects) * len(labels)
        notice = None
        rounds: Rounds | None = None
        if apart.ENABLED:
            try:
                rounds = apart_rounds(ctx.staging, record, subjects, labels, budget_s=budget_s, rounds=MAX_ROUNDS,
                                      min_rounds=MIN_ROUNDS)
            except RuntimeError as exc:
                notice = f"latency timed in the compiling process, not in a worker: {first_line(exc)}"
        if rounds is None:
            rounds = alone_rounds(ctx.staging, record, reference, subjects, labels, budget_s, MAX_ROUNDS, MIN_ROUNDS)
        p50, p99 = rounds.medians(), rounds.p99()
        latency = {b: {p: Latency(shape=reference.shape(p), p50=p50[b][p], p99=max(p99[b][p], p50[b][p]),
                                  iterations=len(rounds.calls[b][p])).model_dump(mode="json")
                       for p in labels if p in p50.get(b, {})} for b in subjects}
        return StageOutput(None, {"latency_us": latency, "notice": notice})

    def detail(self, ctx: Context, out: StageOutput) -> str:
        rows = [f"{b} " + ", ".join(f"{p} {v['p50']:.0f}us" for p, v in points.items())
                for b, points in out.facts["latency_us"].items()]
        return "; ".join(rows) + (f" ({out.facts['notice']})" if out.facts.get("notice") else "")


def apply_latencies(record: NetworkRecord, out: StageOutput) -> None:
    """The stage's latencies into `record`'s artifacts (and its notice, where the workers could not run)."""
    notice = out.facts.get("notice")
    for backend, points in out.facts["latency_us"].items():
        artifact = record.artifacts[backend]
        artifact.latency_us = {p: Latency.model_validate(v) for p, v in points.items()}
        if notice:
            artifact.facts = artifact.facts.updated(notice="; ".join(filter(None, [artifact.facts.notice, notice])))


__all__ = ["MAX_ROUNDS", "MIN_ROUNDS", "TIMING_BUDGET_S", "TimeBackends", "apply_latencies", "artifact_key",
           "timed_backends"]
