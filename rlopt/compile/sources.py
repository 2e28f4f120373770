"""Stable-Baselines3 agents as compile's model source, and their rollout check (contract section 9)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlopt.errors import UsageError, located
from rlopt.recipe import Recipe
from rlopt.stages.frontend import FactorySource, ModelSource


@dataclass
class Sb3Source:
    """`model: {sb3: agent.zip, vecnormalize: stats.pkl}`: networks `actor` / `value` by `module:` path."""

    recipe: Recipe
    recipe_path: Path
    agent: Any = field(default=None, init=False)

    def path(self, value: str) -> Path:
        return self.recipe_path.parent / value

    def load(self) -> tuple[Any, dict[str, Any]]:
        from rlopt.sb3 import agent_model, load_agent

        spec, rollout = self.recipe.model, self.recipe.verify.rollout
        zip_path = self.path(spec.sb3 or "")
        if not zip_path.is_file():
            raise UsageError(located(self.recipe_path, "model.sb3", f"{zip_path} not found",
                                     "give the agent zip's path relative to the recipe"))
        stats = self.path(spec.vecnormalize) if spec.vecnormalize else None
        if stats is not None and not stats.is_file():
            raise UsageError(located(self.recipe_path, "model.vecnormalize", f"{stats} not found",
                                     "give the VecNormalize .pkl path relative to the recipe"))
        self.agent = load_agent(zip_path, vecnormalize=stats, env=rollout.env if rollout else None)
        facts = {"sb3": spec.sb3, "algorithm": self.agent.algorithm, "vecnormalize": spec.vecnormalize}
        return agent_model(self.agent), facts


def model_source(recipe: Recipe, recipe_path: Path) -> ModelSource:
    """The source a recipe's `model` section names: a factory, or an SB3 agent zip."""
    if recipe.model.sb3 is not None:
        return Sb3Source(recipe, recipe_path)
    return FactorySource(recipe, recipe_path)


def stored_recipe(recipe: Recipe, recipe_path: Path, model_dir: Path) -> Recipe:
    """The recipe as MODEL_DIR/recipe.yaml holds it: an agent's zip and statistics relative to MODEL_DIR, so the
    folder can be moved or copied along with them and recompiled from its own recipe."""
    import os

    spec = recipe.model
    if spec.sb3 is None:
        return recipe
    base = Path(os.path.abspath(model_dir))

    def rebase(value: str | None) -> str | None:
        if value is None:
            return None
        target = Path(os.path.abspath(recipe_path.parent / value))
        return Path(os.path.relpath(target, base)).as_posix()

    model = spec.model_copy(update={"sb3": rebase(spec.sb3), "vecnormalize": rebase(spec.vecnormalize)})
    return recipe.model_copy(update={"model": model})


def rollout_failures(source: Sb3Source, recipe: Recipe, staging: Path, record: Any) -> list[str]:
    """`verify.rollout` for network `actor`: every verified backend vs predict; reports go to record.facts."""
    import numpy as np

    from rlopt.backends import open_runner
    from rlopt.sb3 import rollout_check

    rollout = recipe.verify.rollout
    assert rollout is not None and source.agent is not None
    reports: dict[str, Any] = {}
    failures: list[str] = []
    names = list(recipe.networks["actor"].inputs)
    outputs = list(recipe.networks["actor"].outputs)
    for backend, artifact in record.artifacts.items():
        if not artifact.built or artifact.parity is None or not artifact.parity.passed:
            continue
        runner = open_runner(backend, staging / artifact.path, names, artifact.facts)

        def infer(feeds: dict[str, np.ndarray], runner: Any = runner) -> dict[str, np.ndarray]:
            return dict(zip(outputs, runner.infer(feeds)))

        report = rollout_check(source.agent, rollout.env, infer=infer, steps=rollout.steps, seed=rollout.seed,
                               atol=recipe.verify.atol)
        reports[backend] = report.summary()
        if not report.passed:
            failures.append(f"actor/{backend}: rollout: {report.disagreed} of {report.steps} actions differ "
                            f"from predict")
    record.facts = record.facts.updated(rollout=reports, rollout_reference=rollout_reference(
        staging / "actor" / "reference.npz", names[0], rollout.steps))
    return failures


def rollout_reference(path: Path, first_input: str, steps: int) -> dict[str, Any]:
    """What of the rollout joined reference.npz: samples kept of the steps visited, under the file's byte cap."""
    import numpy as np

    from rlopt.reference import REFERENCE_BYTES

    kept = 0
    if path.is_file():
        with np.load(path, allow_pickle=False) as data:
            key = f"rollout:in:{first_input}"
            kept = int(data[key].shape[0]) if key in data.files else 0
    return {"visited": steps, "kept": kept, "max_samples": ROLLOUT_SAMPLES, "cap_bytes": REFERENCE_BYTES,
            "bytes": path.stat().st_size if path.is_file() else 0}


ROLLOUT_SAMPLES = 64   # visited observations kept in reference.npz (point `rollout`, batch 1 each)


def rollout_feeds(source: Sb3Source, recipe: Recipe, module: Any, names: list[str],
                  outputs: list[str]) -> dict[str, Any]:
    """Run `verify.rollout` with the eager actor (before any backend exists): up to ROLLOUT_SAMPLES of the
    visited inputs, evenly spaced along the rollout, each with a batch dim of 1."""
    import numpy as np
    import torch

    from rlopt.arrays import flatten_outputs
    from rlopt.reference import evenly_spaced
    from rlopt.sb3 import rollout_check

    rollout = recipe.verify.rollout
    assert rollout is not None and source.agent is not None

    def eager(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with torch.inference_mode():
            result = flatten_outputs(module(*[torch.from_numpy(np.asarray(feeds[n])) for n in names]))
        return {n: v.detach().numpy() for n, v in zip(outputs, result)}

    report = rollout_check(source.agent, rollout.env, infer=eager, steps=rollout.steps, seed=rollout.seed,
                           atol=recipe.verify.atol)
    count = len(report.inputs[names[0]]) if report.inputs else 0
    index = evenly_spaced(count, ROLLOUT_SAMPLES)
    return {n: report.inputs[n][index][:, None] for n in names} if count else {}


__all__ = ["ROLLOUT_SAMPLES", "Sb3Source", "model_source", "rollout_failures", "rollout_feeds", "stored_recipe"]
