"""Rollout verification: run the agent's own env, compare a backend's action with `predict` at every step."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from rlopt.errors import UsageError, describe_exception, located
from rlopt.sb3.agent import Agent

Infer = Callable[[dict[str, np.ndarray]], Any]   # feeds -> the action array, or a dict of outputs ("action", ...)


@dataclass
class Disagreement:
    step: int
    reference: list[Any]
    got: list[Any]
    margin: float | None = None   # discrete: the reference's top-two score gap


@dataclass
class RolloutReport:
    """Agreement of one backend with `predict(deterministic=True)` along a rollout of the agent's env."""

    env_id: str
    seed: int
    steps: int = 0
    episodes: int = 0
    discrete: bool = True
    atol: float = 1e-4
    agreed: int = 0
    disagreed: int = 0
    ties: int = 0                  # discrete flips where the reference's top two are within atol (not failures)
    max_abs_diff: float = 0.0      # continuous actions (and LSTM state), over all steps
    first_disagreements: list[Disagreement] = field(default_factory=list)
    inputs: dict[str, np.ndarray] = field(default_factory=dict)   # every step's feeds, stacked along the batch dim
    reference_actions: np.ndarray | None = None                    # predict's action at every step, batched

    @property
    def passed(self) -> bool:
        """No disagreement, and something was compared."""
        return self.steps > 0 and self.disagreed == 0

    @property
    def agreement(self) -> float:
        return self.agreed / self.steps if self.steps else 0.0

    def summary(self) -> dict[str, Any]:
        """JSON-ready (strict: no NaN or Infinity, those become null), without the arrays: for the manifest."""
        return {"env": self.env_id, "seed": self.seed, "steps": self.steps, "episodes": self.episodes,
                "discrete": self.discrete, "atol": self.atol, "agreed": self.agreed, "disagreed": self.disagreed,
                "ties": self.ties, "agreement": self.agreement, "max_abs_diff": _finite(self.max_abs_diff),
                "passed": self.passed,
                "first_disagreements": [dict(vars(d), margin=_finite(d.margin)) for d in self.first_disagreements]}


def _finite(value: float | None) -> float | None:
    return value if value is not None and np.isfinite(value) else None


def rollout_check(agent: Agent, env_id: str, *, infer: Infer, steps: int = 1000, seed: int = 0,
                  atol: float = 1e-4) -> RolloutReport:
    """Step `gymnasium.make(env_id)` with predict's action for `steps` steps; at every step compare `infer(feeds)`
    (feeds: the actor's inputs, batch 1, dtypes as the env emits them) with predict. Recurrent agents: the
    backend's own next state is fed back to it, predict keeps its own; episode starts reset both."""
    env = _make(env_id)
    report = RolloutReport(env_id, seed, atol=atol,
                           discrete=bool(np.issubdtype(np.dtype(agent.action_space.dtype), np.integer)))
    recorded: dict[str, list[np.ndarray]] = {}
    actions: list[np.ndarray] = []
    layers_hidden = agent.lstm_state_shape
    state_h = state_c = np.zeros((1, *layers_hidden), np.float32) if layers_hidden else None
    ref_state = None
    try:
        obs, _ = env.reset(seed=seed)
        start = True
        for step in range(steps):
            feeds = observation_feeds(agent, obs)
            batch_obs = feeds["obs"] if not agent.is_dict else {i.key: feeds[i.name] for i in agent.inputs}
            masks = None
            if agent.masked:
                masks = np.asarray(_action_masks(env), dtype=bool).reshape(1, -1)
                feeds["action_masks"] = masks
            if state_h is not None:
                feeds.update(state_h=state_h, state_c=state_c,
                             episode_start=np.array([1.0 if start else 0.0], np.float32))
            reference, next_ref_state = agent.predict(batch_obs, state=ref_state, episode_start=np.array([start]),
                                                      action_masks=masks)
            out = infer(dict(feeds))
            got = np.asarray(out["action"] if isinstance(out, Mapping) else out)
            if state_h is not None:
                if not isinstance(out, Mapping):
                    raise UsageError(located(env_id, "infer", "a recurrent actor's infer must return a dict with "
                                             "action, next_state_h and next_state_c", "return the outputs by name"))
                state_h, state_c = np.asarray(out["next_state_h"]), np.asarray(out["next_state_c"])
            _compare(agent, report, step, reference, got, batch_obs, ref_state, start, masks)
            for name, value in feeds.items():
                recorded.setdefault(name, []).append(np.asarray(value))
            actions.append(np.asarray(reference))
            ref_state = next_ref_state
            obs, _reward, terminated, truncated, _ = env.step(reference[0])
            start = bool(terminated or truncated)
            if start:
                report.episodes += 1
                obs, _ = env.reset()
    finally:
        env.close()
    report.inputs = {name: np.concatenate(values, axis=0) for name, values in recorded.items()}
    report.reference_actions = np.concatenate(actions, axis=0) if actions else None
    return report


def observation_feeds(agent: Agent, obs: Any) -> dict[str, np.ndarray]:
    """A raw env observation as the actor's observation inputs, with a batch dim of 1."""
    feeds: dict[str, np.ndarray] = {}
    for spec in agent.inputs:
        value = np.asarray(obs[spec.key] if spec.key is not None else obs)
        if value.shape != spec.shape:
            raise UsageError(located(agent.env_id or "env", spec.name, f"the env emits shape {value.shape}, the "
                                     f"actor takes {spec.shape}",
                                     "load the agent with env= set to this env, so the layout follows it"))
        feeds[spec.name] = value.astype(spec.dtype, copy=False).reshape((1, *spec.shape))
    return feeds


def _compare(agent: Agent, report: RolloutReport, step: int, reference: np.ndarray, got: np.ndarray,
             batch_obs: Any, ref_state: Any, start: bool, masks: Any) -> None:
    report.steps += 1
    reference = np.asarray(reference)
    same_shape = got.shape == reference.shape
    margin: float | None = None
    if report.discrete:
        ok = same_shape and bool(np.array_equal(got, reference))
        if not ok and same_shape:
            margin = reference_margin(agent, batch_obs, ref_state, start, masks)
            if margin <= report.atol:
                report.ties += 1
                report.agreed += 1
                return
    else:
        diff = float(np.max(np.abs(got.astype(np.float64) - reference))) if same_shape and got.size else np.inf
        diff = np.inf if np.isnan(diff) else diff
        report.max_abs_diff = max(report.max_abs_diff, diff)
        ok = same_shape and diff <= report.atol
    if ok:
        report.agreed += 1
        return
    report.disagreed += 1
    if len(report.first_disagreements) < 5:
        report.first_disagreements.append(Disagreement(step, reference.tolist(), got.tolist(), margin))


def reference_margin(agent: Agent, batch_obs: Any, ref_state: Any, start: bool, masks: Any) -> float:
    """The reference's gap between its best and second-best action scores (smallest over sub-actions)."""
    import torch

    policy = agent.policy
    obs_t, _ = policy.obs_to_tensor(agent.normalize(batch_obs))
    with torch.no_grad():
        if agent.algorithm == "DQN":
            scores = [policy.q_net(obs_t)]
        else:
            if agent.recurrent:
                layers, hidden = agent.lstm_state_shape or (1, 1)
                h, c = ref_state if ref_state is not None else (np.zeros((layers, 1, hidden)),) * 2
                states = (torch.as_tensor(h, dtype=torch.float32), torch.as_tensor(c, dtype=torch.float32))
                dist, _ = policy.get_distribution(obs_t, states, torch.tensor([float(start)]))
            elif agent.masked:
                dist = policy.get_distribution(obs_t, action_masks=masks)
            else:
                dist = policy.get_distribution(obs_t)
            inner = dist.distribution
            if isinstance(inner, torch.distributions.Bernoulli):   # MultiBinary: each bit's distance from 0.5
                return float(inner.logits.abs().min())
            scores = [d.logits for d in inner] if isinstance(inner, list) else [inner.logits]
    gaps = []
    for s in scores:
        top = torch.topk(s.reshape(-1), k=min(2, s.numel())).values
        gaps.append(float(top[0] - top[1]) if top.numel() > 1 else float("inf"))
    return min(gaps)


def _make(env_id: str) -> Any:
    try:
        import gymnasium
    except ImportError as exc:
        raise UsageError(located(env_id, "verify.rollout.env", "gymnasium is not installed",
                                 "pip install 'rlopt[sb3]'")) from exc
    try:
        return gymnasium.make(env_id)
    except Exception as exc:  # gymnasium raises many types for a bad id or a broken entry point
        raise UsageError(located(env_id, "verify.rollout.env", f"gymnasium.make failed: {describe_exception(exc)}",
                                 "give a registered gymnasium id (import the package that registers it)")) from exc


def _action_masks(env: Any) -> Any:
    try:
        return env.get_wrapper_attr("action_masks")()
    except AttributeError:
        return env.unwrapped.action_masks()
