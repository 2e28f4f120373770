"""The engine: runs stages over a network's Context and owns everything around them.

Timing and progress (the Reporter protocol), skips (BackendUnavailable), build failures, and the
stage cache. A stage's cache key chains like Olive's output ids: its code version (its own module
and declared helpers, not all of rlopt), its recipe slice, its upstream artifacts' keys, the versions of the
libraries it runs (the front end's, and its backend's declared distributions for a backend's stage), and this
machine's identity (CPU, and GPU where one is) only where the stage's output depends on it.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from rlopt.backends import stage_versions
from rlopt.compile.cache import StageCache, cache_key
from rlopt.stages.base import Context, Stage, StageOutput
from rlopt.errors import BackendUnavailable, StageError
from rlopt.facts import Facts
from rlopt.machine import cpu_identity, gpu_identity


class Reporter(Protocol):
    def stage_started(self, network: str, stage: str) -> None: ...

    def stage_finished(self, network: str, stage: str, status: str, seconds: float, detail: str) -> None: ...


class Silent:
    def stage_started(self, network: str, stage: str) -> None:
        pass

    def stage_finished(self, network: str, stage: str, status: str, seconds: float, detail: str) -> None:
        pass




def key_components(stage: Stage, ctx: Context, backend: str | None = None) -> dict[str, Any]:
    """What a stage's output depends on; sha256 of these (canonical JSON) is its cache key. `backend`: the backend
    whose stage (build or verification) this is, so its library's version joins the key."""
    upstream = stage.upstream(ctx)
    if not stage.weights_dependent:  # keyed by the graph alone: reusable after new weights (a refit)
        upstream = {name: ({k: v for k, v in key.items() if k != "weights"} if isinstance(key, dict) else key)
                    for name, key in upstream.items()}
    components: dict[str, Any] = {"stage": stage.label, "code": stage.code_version(), "config": stage.config(ctx),
                                  "upstream": upstream, "backend": backend, "versions": stage_versions(backend)}
    if stage.machine_dependent:
        components["machine"] = cpu_identity()
        gpu = gpu_identity()
        if gpu is not None:  # a plan, verdict or latency from another GPU, driver or TensorRT is never reused
            components["gpu"] = gpu
    return components


@dataclass
class BackendOutcome:
    output: StageOutput | None = None
    skipped: str | None = None
    failure: str | None = None
    facts: dict[str, Any] = field(default_factory=dict)  # what a skipped backend had settled (BackendUnavailable)
    identity: Any = None  # the producing stage's artifact_identity (None: the artifact's bytes)


class Engine:
    def __init__(self, reporter: Reporter, cache: StageCache) -> None:
        self.reporter, self.cache = reporter, cache

    def run_all(self, stages: list[Stage], ctx: Context) -> None:
        for stage in stages:
            self.run(stage, ctx)

    def run(self, stage: Stage, ctx: Context, backend: str | None = None) -> StageOutput | None:
        """Run one stage (or reuse its cached output); None when it does not apply to this network. `backend`: the
        backend whose stage it is (its library's version keys the cache)."""
        if not stage.applies(ctx):
            return None
        label = stage.label
        self.reporter.stage_started(ctx.name, label)
        start = time.perf_counter()
        outcome: str | None = None
        try:
            components = key_components(stage, ctx, backend)
            if stage.cacheable(ctx):
                out, outcome = self._cached(stage, ctx, components)
            else:
                out = stage.run(ctx)
        except BackendUnavailable as exc:
            self._finish(ctx, label, "skipped", start, str(exc), outcome)
            raise
        except Exception:  # recorded as the stage's error row, then raised as it is (rlopt.errors: whose fault decides)
            self._finish(ctx, label, "error", start, "", outcome)
            raise
        ctx.outputs[label] = out
        for name in stage.outputs[:1]:
            if out.artifact is not None or name not in ctx.artifacts:
                ctx.artifacts[name] = out.artifact
            ctx.keys.setdefault(name, cache_key(components))
        self._finish(ctx, label, "ok", start, stage.detail(ctx, out), outcome)
        return out

    def run_backend(self, backend: str, stages: list[Stage], ctx: Context) -> BackendOutcome:
        """A backend's stages in order; its artifact is the last one's. Unavailable = skipped with the reason."""
        outcome = BackendOutcome()
        try:
            for stage in stages:
                out = self.run(stage, ctx, backend)
                if out is not None:
                    outcome.output, outcome.identity = out, stage.artifact_identity(ctx, out)
        except BackendUnavailable as exc:
            return BackendOutcome(skipped=str(exc), facts=exc.facts)
        except StageError as exc:
            return BackendOutcome(skipped=f"build failed: {exc}", failure=f"{ctx.name}/{backend}: build failed: {exc}")
        if outcome.output is None:
            return BackendOutcome(skipped=f"no stage of '{backend}' applies to this recipe")
        return outcome

    def _cached(self, stage: Stage, ctx: Context, components: dict[str, Any]) -> tuple[StageOutput, str]:
        label = stage.label
        hit = self.cache.lookup(label, components)
        if hit is not None:
            for name, path in hit.files.items():
                shutil.copyfile(path, ctx.dir / name)
            artifact, facts = hit.facts.get("artifact"), hit.facts.get("facts", {})
            typed = stage.facts_model.model_validate(facts) if stage.facts_model is not None else facts
            out = StageOutput(ctx.dir / artifact if artifact else None, typed)
            outcome = "hit"
        else:
            outcome = ("miss: " + self.cache.explain_miss(ctx.scope, label, components)) if self.cache.enabled \
                else "off (--no-cache)"
            before = set(ctx.dir.iterdir())
            out = stage.run(ctx)
            files = {p.name: p for p in sorted(ctx.dir.iterdir()) if p.is_file() and p not in before}
            artifact = out.artifact.name if isinstance(out.artifact, Path) else None
            facts = out.facts.as_dict() if isinstance(out.facts, Facts) else out.facts
            self.cache.store(label, components, files, {"artifact": artifact, "facts": facts})
        self.cache.remember(ctx.scope, label, components)
        return out, outcome

    def _finish(self, ctx: Context, stage: str, status: str, start: float, detail: str, cache: str | None) -> None:
        seconds = time.perf_counter() - start
        entry: dict[str, Any] = {"stage": stage, "status": status, "seconds": round(seconds, 3), "detail": detail}
        if cache is not None:
            entry["cache"] = cache
            detail = f"{detail} [cache {cache}]".strip()
        ctx.stages.append(entry)
        self.reporter.stage_finished(ctx.name, stage, status, seconds, detail)


__all__ = ["BackendOutcome", "Engine", "Reporter", "Silent", "key_components"]
