"""The recipe content `rlopt compile agent.zip` generates (contract sections 1, 8 and 9)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from rlopt.sb3.agent import Agent
from rlopt.sb3.build import actor_outputs, value_outputs

BATCH = (1, 64, 256)   # default batch profile: min, opt, max


def agent_recipe(agent: Agent, zip_path: str | Path, vecnormalize: str | Path | None = None, *,
                 batch: tuple[int, int, int] = BATCH, rollout_steps: int = 1000) -> dict[str, Any]:
    """Recipe content for the agent: `model: {sb3, vecnormalize}`, networks `actor` (kind generic: its output is
    an action) and `value` where the algorithm has one, inputs with the env's own dtypes and layouts. Paths are
    written as given: make them relative to where the recipe is written. `verify.rollout` when the agent knows
    its env."""
    model: dict[str, Any] = {"sb3": str(zip_path)}
    if vecnormalize is not None:
        model["vecnormalize"] = str(vecnormalize)
    observations = {obs.name: _input(obs.dtype, obs.shape, batch, obs.range) for obs in agent.inputs}
    actor_inputs = dict(observations)
    if agent.masked:
        actor_inputs["action_masks"] = _input("bool", (agent.n_mask or 1,), batch)
    actor: dict[str, Any] = {"module": "actor", "kind": "generic", "inputs": actor_inputs,
                             "outputs": actor_outputs(agent)}
    if agent.lstm_state_shape is not None:
        layers_hidden = agent.lstm_state_shape
        actor_inputs["state_h"] = _input("float32", layers_hidden, batch)
        actor_inputs["state_c"] = _input("float32", layers_hidden, batch)
        actor_inputs["episode_start"] = _input("float32", (), batch)
        actor["state"] = {"state_h": "next_state_h", "state_c": "next_state_c"}
    networks: dict[str, Any] = {"actor": actor}
    if agent.value_reason is None:
        networks["value"] = {"module": "value", "kind": "value", "inputs": dict(observations),
                             "outputs": value_outputs(agent)}
    recipe: dict[str, Any] = {"name": recipe_name(Path(zip_path)), "model": model, "networks": networks}
    if agent.env_id:
        recipe["verify"] = {"rollout": {"env": agent.env_id, "steps": rollout_steps, "seed": 0}}
    return recipe


def recipe_name(zip_path: Path) -> str:
    """The artifact name from the zip's file name, in the recipe's [a-z0-9_-]+."""
    name = re.sub(r"[^a-z0-9_-]+", "-", zip_path.stem.lower()).strip("-")
    return name or "agent"


def _input(dtype: str, shape: tuple[int, ...], batch: tuple[int, int, int],
           value_range: tuple[int, int] | None = None) -> dict[str, Any]:
    low, opt, high = batch
    spec: dict[str, Any] = {"dtype": dtype, "min": [low, *shape], "opt": [opt, *shape], "max": [high, *shape]}
    if value_range is not None:
        spec["range"] = [int(value_range[0]), int(value_range[1])]
    return spec
