"""The engine and the Stage interface: timing, progress, skips, build failures, chained cache keys."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from rlopt.compile.cache import StageCache
from rlopt.backends import stage_versions
from rlopt.compile.engine import Engine, key_components
from rlopt.stages.base import Context, Stage, StageOutput, code_digest
from rlopt.errors import BackendUnavailable, StageError
from rlopt.recipe import load_recipe
from tests.conftest import write_tiny_recipe


class Recorder:
    def __init__(self) -> None:
        self.events: list[tuple[str, ...]] = []

    def stage_started(self, network: str, stage: str) -> None:
        self.events.append(("start", network, stage))

    def stage_finished(self, network: str, stage: str, status: str, seconds: float, detail: str) -> None:
        self.events.append(("finish", network, stage, status, detail))


class WriteText(Stage):
    """A toy cached stage: writes its config into a file."""

    name, inputs, outputs, cached = "write", ("source",), ("text.txt",), True
    runs = 0

    def config(self, ctx: Context) -> Any:
        return {"text": ctx.artifacts.get("wanted", "hello")}

    def run(self, ctx: Context) -> StageOutput:
        type(self).runs += 1
        path = ctx.dir / "text.txt"
        path.write_text(self.config(ctx)["text"])
        return StageOutput(path, {"length": len(self.config(ctx)["text"])})


class Unavailable(Stage):
    name = "nowhere"

    def run(self, ctx: Context) -> StageOutput:
        raise BackendUnavailable("no such device here")


class Broken(Stage):
    name = "broken"

    def run(self, ctx: Context) -> StageOutput:
        raise StageError("the model cannot be built")


class NotForThisNetwork(Stage):
    name = "never"

    def applies(self, ctx: Context) -> bool:
        return False


@pytest.fixture()
def ctx(tmp_path: Path) -> Context:
    recipe_path = write_tiny_recipe(tmp_path)
    recipe = load_recipe(recipe_path)
    context = Context(recipe, recipe_path, "policy", recipe.networks["policy"], tmp_path / "staging")
    context.dir.mkdir(parents=True)
    context.keys["source"] = {"graph": "g1", "weights": "w1"}
    return context


def test_a_stage_is_timed_reported_and_its_output_filed(ctx: Context, tmp_path: Path) -> None:
    reporter = Recorder()
    out = Engine(reporter, StageCache(tmp_path / "cache")).run(WriteText(), ctx)
    assert out is not None and ctx.artifacts["text.txt"] == ctx.dir / "text.txt"
    assert reporter.events[0] == ("start", "policy", "write") and reporter.events[1][3] == "ok"
    entry = ctx.stages[0]
    assert entry["stage"] == "write" and entry["status"] == "ok" and entry["cache"].startswith("miss")
    assert isinstance(ctx.keys["text.txt"], str) and len(ctx.keys["text.txt"]) == 64


def test_the_cache_hits_and_a_config_or_upstream_change_misses_with_the_reason(ctx: Context, tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache")
    WriteText.runs = 0
    engine = Engine(Recorder(), cache)
    engine.run(WriteText(), ctx)
    (ctx.dir / "text.txt").unlink()
    engine.run(WriteText(), ctx)
    assert WriteText.runs == 1 and ctx.stages[-1]["cache"] == "hit" and (ctx.dir / "text.txt").read_text() == "hello"
    ctx.artifacts["wanted"] = "other"
    engine.run(WriteText(), ctx)
    assert ctx.stages[-1]["cache"] == "miss: text changed"
    ctx.keys["source"] = {"graph": "g1", "weights": "w2"}
    engine.run(WriteText(), ctx)
    assert ctx.stages[-1]["cache"] == "miss: model weights changed"


def test_keys_hold_code_version_config_upstream_and_machine_only_where_it_matters(ctx: Context) -> None:
    components = key_components(WriteText(), ctx)
    assert components["code"] == code_digest([__name__]), "the stage's own module, not all of rlopt"
    assert components["upstream"] == {"source": {"graph": "g1", "weights": "w1"}}
    assert components["versions"] == stage_versions() and "rlopt_source" not in stage_versions()
    assert "machine" not in components

    class OnThisCpu(WriteText):
        machine_dependent = True
        helpers = ("rlopt.compile.publish",)

    assert "machine" in key_components(OnThisCpu(), ctx)

    class GraphOnly(WriteText):
        weights_dependent = False

    assert key_components(GraphOnly(), ctx)["upstream"] == {"source": {"graph": "g1"}}, "reusable after a refit"
    assert OnThisCpu.code_version() == code_digest([__name__, "rlopt.compile.publish"])


def test_skips_and_build_failures_are_the_engines(ctx: Context, tmp_path: Path) -> None:
    engine = Engine(Recorder(), StageCache(enabled=False))
    skipped = engine.run_backend("nowhere", [Unavailable()], ctx)
    assert skipped.output is None and skipped.skipped == "no such device here" and skipped.failure is None
    failed = engine.run_backend("broken", [Broken()], ctx)
    assert failed.skipped == "build failed: the model cannot be built"
    assert failed.failure == "policy/broken: build failed: the model cannot be built"
    assert [s["status"] for s in ctx.stages] == ["skipped", "error"]
    assert engine.run(NotForThisNetwork(), ctx) is None and len(ctx.stages) == 2, "a stage that does not apply is silent"


def test_every_backend_registers_its_stages() -> None:
    from rlopt.backends import BACKENDS
    from rlopt.compile.network import backend_stages

    for name in BACKENDS:
        stages = backend_stages(name)
        assert stages and all(isinstance(s, Stage) and s.outputs == (name,) for s in stages), name
