"""Assemble an agent's `actor` and `value` graphs from its SB3 policy (see graph.py for the pieces)."""

from __future__ import annotations

import copy
from typing import Any

from rlopt.errors import RecipeError, first_line, located
from rlopt.lazy import require
from rlopt.sb3 import graph
from rlopt.sb3.agent import Agent, ObsInput


def actor_inputs(agent: Agent) -> list[str]:
    """The actor's input names, in forward's order."""
    names = [obs.name for obs in agent.inputs]
    if agent.masked:
        names.append("action_masks")
    if agent.recurrent:
        names += ["state_h", "state_c", "episode_start"]
    return names


def actor_outputs(agent: Agent) -> list[str]:
    return ["action", "next_state_h", "next_state_c"] if agent.recurrent else ["action"]


def value_outputs(agent: Agent) -> list[str]:
    return ["q_values"] if agent.algorithm == "DQN" else ["value"]


def actor_module(agent: Agent) -> Any:
    """raw observation(s) [+ action_masks] [+ state_h, state_c, episode_start] -> action [+ next state]:
    exactly what `agent.predict` (model.predict(..., deterministic=True)) returns, batched."""
    require("torch")
    owner, extractor, latent, head = _actor_parts(agent)
    lstm = _lstm(agent) if agent.recurrent else None
    doc = (f"{agent.algorithm} actor of {agent.zip_path.name}: {', '.join(actor_inputs(agent))} -> "
           f"{', '.join(actor_outputs(agent))}")
    return graph.network(_paths(agent, owner, extractor), lstm, _copy(latent), _copy(head), _finish(agent),
                         names=actor_inputs(agent), masked=agent.masked, doc=doc)


def value_module(agent: Agent) -> Any | None:
    """obs -> value [batch, 1] (PPO, A2C, MaskablePPO) or q_values [batch, n] (DQN); None with
    `agent.value_reason` for SAC, TD3 and RecurrentPPO."""
    if agent.value_reason is not None:
        return None
    torch = require("torch")
    policy = agent.policy
    if agent.algorithm == "DQN":
        owner, extractor, latent, head = policy.q_net, policy.q_net.features_extractor, None, policy.q_net.q_net
    else:
        owner, extractor = policy, policy.vf_features_extractor
        latent, head = policy.mlp_extractor.value_net, policy.value_net
    names = [obs.name for obs in agent.inputs]
    doc = f"{agent.algorithm} value of {agent.zip_path.name}: {', '.join(names)} -> {value_outputs(agent)[0]}"
    return graph.network(_paths(agent, owner, extractor), None, _copy(latent), _copy(head), torch.nn.Identity(),
                         names=names, masked=False, doc=doc)


def agent_model(agent: Agent) -> Any:
    """One nn.Module holding `actor` and (where there is one) `value`: the recipe's `module:` paths."""
    return graph.AgentModel(actor_module(agent), value_module(agent)).eval()


def script(module: Any, agent: Agent, network: str = "actor") -> Any:
    """torch.jit.script(module); if it fails, a RecipeError naming the first SB3 component that cannot be scripted."""
    torch = require("torch")
    try:
        return torch.jit.script(module)
    except Exception as exc:  # TorchScript raises several types; narrowed to a component below
        culprit = _unscriptable(module, torch)
        what = f"{type(culprit[1]).__name__} at {network}.{culprit[0]}" if culprit else f"the {network} graph"
        raise RecipeError(located(agent.zip_path, f"networks.{network}",
                                  f"{what} cannot be scripted ({first_line(exc)})",
                                  "give the policy's custom modules a TorchScript-compatible forward (typed tensor "
                                  "arguments, no dicts or Python objects)")) from exc


def _unscriptable(module: Any, torch: Any) -> tuple[str, Any] | None:
    """The innermost submodule (not one of rlopt's) that fails to script on its own."""
    for name, child in module.named_children():
        inner = _unscriptable(child, torch)
        if inner:
            return f"{name}.{inner[0]}", inner[1]
        if type(child).__module__.startswith("rlopt."):
            continue
        try:
            torch.jit.script(child)
        except Exception:  # noqa: BLE001 - any failure names this component
            return name, child
    return None


def _actor_parts(agent: Agent) -> tuple[Any, Any, Any, Any]:
    """(module owning normalize_images, features extractor, latent net, action head) of the deterministic actor."""
    policy = agent.policy
    if agent.algorithm == "DQN":
        return policy.q_net, policy.q_net.features_extractor, None, policy.q_net.q_net
    if agent.algorithm == "SAC":
        return policy.actor, policy.actor.features_extractor, policy.actor.latent_pi, policy.actor.mu
    if agent.algorithm == "TD3":
        return policy.actor, policy.actor.features_extractor, None, policy.actor.mu
    return policy, policy.pi_features_extractor, policy.mlp_extractor.policy_net, policy.action_net


def _lstm(agent: Agent) -> Any:
    lstm = agent.policy.lstm_actor
    if lstm.bidirectional or getattr(lstm, "proj_size", 0) or lstm.batch_first:
        raise RecipeError(located(agent.zip_path, "policy_kwargs.lstm_kwargs", "a bidirectional, projected or "
                                  "batch-first LSTM is not supported", "train with SB3's default lstm_kwargs"))
    return graph.LSTMStep(lstm)


def _finish(agent: Agent) -> Any:
    """Scores of the head -> the action predict returns."""
    from gymnasium import spaces

    space = agent.action_space
    if isinstance(space, spaces.Discrete):
        return graph.Argmax([int(space.n)], multi=False)
    if isinstance(space, spaces.MultiDiscrete):
        return graph.Argmax([int(n) for n in space.nvec.reshape(-1)], multi=True)
    if isinstance(space, spaces.MultiBinary):
        return graph.Bernoulli()
    if isinstance(space, spaces.Box):
        squash = bool(agent.policy.squash_output)
        tanh = agent.algorithm == "SAC" or (squash and agent.algorithm != "TD3")   # TD3's mu ends in Tanh
        return graph.BoxAction(list(space.shape), space.low, space.high, tanh=tanh, rescale=squash)
    raise RecipeError(located(agent.zip_path, "action_space", f"{type(space).__name__} actions are not supported",
                              "use a Box, Discrete, MultiDiscrete or MultiBinary action space"))


def _paths(agent: Agent, owner: Any, extractor: Any) -> list[Any]:
    """Per observation input: VecNormalize, layout, SB3's preprocess_obs, then its features extractor."""
    from stable_baselines3.common.torch_layers import CombinedExtractor

    if agent.is_dict:
        if not isinstance(extractor, CombinedExtractor):
            raise RecipeError(located(agent.zip_path, "policy_kwargs.features_extractor_class",
                                      f"{type(extractor).__name__} takes a dict of tensors; rlopt compiles Dict "
                                      "observations through CombinedExtractor's per-key extractors",
                                      "use CombinedExtractor (MultiInputPolicy's default)"))
        extractors = [extractor.extractors[obs.key] for obs in agent.inputs]
    else:
        extractors = [extractor]
    return [_path(agent, owner, obs, ext) for obs, ext in zip(agent.inputs, extractors)]


def _path(agent: Agent, owner: Any, obs: ObsInput, extractor: Any) -> Any:
    import torch
    from gymnasium import spaces
    from stable_baselines3.common.preprocessing import is_image_space

    steps: list[Any] = []
    stats = agent.vecnormalize
    if obs.norm is not None and stats is not None:
        steps.append(graph.Normalize(obs.norm[0], obs.norm[1], stats.epsilon, stats.clip_obs))
    if obs.channel_last:
        steps.append(graph.ChannelFirst())
    space = obs.space
    if isinstance(space, spaces.Discrete):
        steps.append(graph.OneHot([int(space.n)]))
    elif isinstance(space, spaces.MultiDiscrete):
        steps.append(graph.OneHot([int(n) for n in space.nvec.reshape(-1)]))
    else:
        image = bool(owner.normalize_images) and is_image_space(space)
        steps.append(graph.ToFloat(255.0 if image else 1.0))
    steps.append(_copy(extractor))
    return torch.nn.Sequential(*steps)


def _copy(module: Any) -> Any:
    """A private copy (the graph must not share parameters with the live SB3 model); Identity for None.
    NumPy scalars in module attributes become Python ones: a MultiDiscrete space's sizes reach nn.Linear's
    in_features as numpy.int64, which TorchScript refuses as a constant."""
    import numpy as np
    import torch

    if module is None:
        return torch.nn.Identity()
    module = copy.deepcopy(module).eval()
    for sub in module.modules():
        for name, value in list(vars(sub).items()):
            if isinstance(value, np.generic) and not name.startswith("__"):
                setattr(sub, name, value.item())
    return module
