"""`rlopt compile`: recipe -> model source -> per network the engine's stage lists -> manifest -> atomic publish."""

from __future__ import annotations

import shutil
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from rlopt import __version__
from rlopt.compile.cache import StageCache
from rlopt.backends import BACKENDS as BACKEND_REGISTRY, tool_versions
from rlopt.compile.engine import Engine, Reporter, Silent
from rlopt.stages.frontend import ModelSource
from rlopt.compile.auto import ChooseAuto
from rlopt.compile.latency import TimeBackends
from rlopt.compile.network import compile_network
from rlopt.compile.apart import kept_workers
from rlopt.compile.route_passes import most_passes
from rlopt.compile.publish import is_model_dir_or_empty, publish, remove_stale_partials, staging_dir
from rlopt.compile.sources import model_source, stored_recipe
from rlopt.stages.base import Context
from rlopt.errors import RloptError, UsageError, explain_validation_error, located
from rlopt.locking import exclusive_lock
from rlopt.machine import machine_facts
from rlopt.manifest import (MANIFEST_NAME, SCHEMA_VERSION, BuildResult, Manifest, NetworkRecord, file_record,
                            write_json)
from rlopt.recipe import BACKENDS, Recipe, load_recipe


class CompileResult(BuildResult):
    """What `rlopt compile` wrote and found."""


def resolve_options(recipe: Recipe, backends: list[str] | None, overrides: dict[str, dict[str, Any]] | None,
                    recipe_path: Path) -> Recipe:
    """The recipe with the command line's choices: `backends` replaces its list, `overrides` update fields of a
    backend's section (section -> field -> value, validated like the recipe)."""
    if backends:
        unknown = [b for b in backends if b not in BACKENDS]
        if unknown:
            raise UsageError(f"--backend {unknown[0]}: unknown backend; fix: use one of {', '.join(BACKENDS)}")
        recipe = recipe.model_copy(update={"backends": list(dict.fromkeys(backends))})
    for section, fields in (overrides or {}).items():
        if section not in recipe.backend_sections():
            raise UsageError(f"{section}: no such recipe section; fix: use one of {', '.join(recipe.backend_sections())}")
        current = recipe.section(section)
        try:
            updated = type(current).model_validate({**current.model_dump(), **fields})
        except ValidationError as exc:
            raise UsageError(explain_validation_error(f"{recipe_path} ({section} from the command line)", exc)) from None
        recipe = recipe.model_copy(update={section: updated})
    return recipe


def default_output_dir(recipe: Recipe) -> Path:
    return Path("artifacts") / recipe.name


def compile_recipe(recipe_path: Path | str, out_dir: Path | str | None = None, *, backends: list[str] | None = None,
                   overrides: dict[str, dict[str, Any]] | None = None, reporter: Reporter | None = None,
                   cache: StageCache | None = None, source: ModelSource | None = None,
                   retime: bool = False) -> CompileResult:
    """Compile every network of a recipe into MODEL_DIR; returns the manifest and any verification failures.

    `backends` replaces the recipe's list; `overrides` update backends' sections (e.g. {"tvm": {"tune_trials": 8}}).

    `cache` defaults to the stage cache under $RLOPT_CACHE; pass StageCache(enabled=False) to bypass it.
    `source` makes the model (default: the one the recipe's `model` section names). `retime`: measure the
    latencies and `auto`'s routes again instead of reusing the cached ones (the new ones replace them in the cache).
    """

    started = time.perf_counter()
    most_passes()  # a malformed $RLOPT_ROUTE_PASSES is refused before any work
    cache = cache if cache is not None else StageCache()
    if retime:
        cache.refresh = cache.refresh | {TimeBackends.name, ChooseAuto.name}
    recipe_path = Path(recipe_path)
    engine = Engine(reporter or Silent(), cache)
    recipe = resolve_options(load_recipe(recipe_path), backends, overrides, recipe_path)
    out_dir = Path(out_dir) if out_dir is not None else default_output_dir(recipe)
    if not is_model_dir_or_empty(out_dir):
        raise UsageError(located(out_dir, "-o", "exists and is not an rlopt MODEL_DIR",
                                 "choose another output directory or remove it"))
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(out_dir.parent / f".{out_dir.name}.lock", out_dir):
        remove_stale_partials(out_dir)
        staging = staging_dir(out_dir)
        try:
            stored = stored_recipe(recipe, recipe_path, out_dir)
            (staging / "recipe.yaml").write_text(stored.resolved_yaml(), encoding="utf-8")
            source = source or model_source(recipe, recipe_path)
            model, _ = source.load()
            timed_apart = any(BACKEND_REGISTRY[b].timed_apart for b in recipe.backends)
            with kept_workers(start=timed_apart and len(recipe.backends) > 1):
                networks, failures = _compile_networks(engine, recipe, recipe_path, staging, source, model)
            manifest = Manifest(
                schema_version=SCHEMA_VERSION, name=recipe.name, rlopt_version=__version__,
                created_at=datetime.now(timezone.utc).isoformat(timespec="seconds"), versions=tool_versions(),
                machine=machine_facts(), recipe_sha256=stored.sha256(),
                recipe=file_record(staging, staging / "recipe.yaml"), networks=networks,
            ).seal()
            write_json(staging / MANIFEST_NAME, manifest.model_dump(mode="json"))
            publish(staging, out_dir)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return CompileResult(out_dir, manifest, failures, time.perf_counter() - started, list(cache.warnings))


def _compile_networks(engine: Engine, recipe: Recipe, recipe_path: Path, staging: Path, source: ModelSource,
                      model: Any) -> tuple[dict[str, NetworkRecord], list[str]]:
    """Every network's stage lists, in the recipe's order; with a rollout, the actor is checked on it too."""
    from rlopt.user_model import submodule

    networks: dict[str, NetworkRecord] = {}
    failures: list[str] = []
    for name, spec in recipe.networks.items():
        ctx = Context(recipe, recipe_path, name, spec, staging, module=submodule(model, spec.module, recipe_path, name))
        if name == "actor" and recipe.verify.rollout is not None and hasattr(source, "agent"):
            from rlopt.compile.sources import rollout_feeds

            ctx.artifacts["rollout_feeds"] = rollout_feeds(source, recipe, ctx.module, list(spec.inputs),
                                                           list(spec.outputs))
        networks[name] = compile_network(engine, ctx)
        failures.extend(ctx.failures)
        if name == "actor" and recipe.verify.rollout is not None and hasattr(source, "agent"):
            from rlopt.compile.sources import rollout_failures

            failures.extend(rollout_failures(source, recipe, staging, networks[name]))
    return networks, failures


def compile_agent(zip_path: Path | str, out_dir: Path | str | None = None, *, vecnormalize: Path | str | None = None,
                  env: str | None = None, **options: Any) -> Any:
    """`rlopt compile agent.zip`: generate the recipe (rlopt.sb3.agent_recipe), compile it, keep it as
    DIR/recipe.yaml. `options` go to compile_recipe (backends, overrides, reporter, cache)."""
    import tempfile

    import yaml

    from rlopt.sb3 import agent_recipe, load_agent

    zip_path = Path(zip_path).resolve()
    if not zip_path.is_file():
        raise UsageError(located(zip_path, "agent", "not found", "give the path of an SB3 model.save() zip"))
    stats = Path(vecnormalize).resolve() if vecnormalize is not None else None
    if stats is not None and not stats.is_file():
        raise UsageError(located(stats, "--vecnormalize", "not found", "give the VecNormalize .pkl path"))
    agent = load_agent(zip_path, vecnormalize=stats, env=env)
    document = agent_recipe(agent, zip_path, stats)
    if env:
        document["verify"] = {"rollout": {"env": env, "steps": 1000, "seed": 0}}
    with tempfile.TemporaryDirectory(prefix="rlopt-agent-") as folder:
        recipe_path = Path(folder) / "recipe.yaml"
        recipe_path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
        named = f"{zip_path} (its generated recipe)"  # the temporary recipe is gone when the user reads the line
        try:
            result = compile_recipe(recipe_path, out_dir, **options)
        except RloptError as exc:
            raise type(exc)(str(exc).replace(str(recipe_path), named)) from None
        result.failures = [failure.replace(str(recipe_path), named) for failure in result.failures]
        return result
