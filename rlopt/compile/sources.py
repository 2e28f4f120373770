"""Stable-Baselines3 agents as compile's model source, and their rollout check (contract section 9)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rlopt.errors import UsageError, located
from rlopt.recipe import Recipe


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
    record.facts["rollout"] = reports
    return failures


__all__ = ["Sb3Source", "rollout_failures"]
