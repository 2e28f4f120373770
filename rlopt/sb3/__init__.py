"""Stable-Baselines3 / sb3-contrib agents as a model source (contract section 9).

`load_agent` reads a `model.save()` zip; `actor_module` / `value_module` turn it into scriptable nn.Modules that
reproduce `model.predict(obs, deterministic=True)` from the raw observation; `agent_recipe` is the recipe content
`rlopt compile agent.zip` generates; `rollout_check` runs the agent's env and compares any backend with predict.
Importing this package needs neither torch nor stable-baselines3 (`pip install 'rlopt[sb3]'` for using it).
"""

from rlopt.sb3.agent import Agent, ObsInput, VecNormStats, load_agent
from rlopt.sb3.build import actor_inputs, actor_module, actor_outputs, agent_model, script, value_module, value_outputs
from rlopt.sb3.recipe import agent_recipe
from rlopt.sb3.rollout import RolloutReport, observation_feeds, rollout_check

__all__ = [
    "Agent", "ObsInput", "VecNormStats", "load_agent",
    "actor_inputs", "actor_module", "actor_outputs", "agent_model", "script", "value_module", "value_outputs",
    "agent_recipe", "RolloutReport", "observation_feeds", "rollout_check",
]
