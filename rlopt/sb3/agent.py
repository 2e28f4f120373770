"""Load a Stable-Baselines3 / sb3-contrib `model.save()` zip (and VecNormalize statistics) as an `Agent`.

Nothing here imports torch or stable-baselines3 at import time: rlopt's modules import without them.
"""

from __future__ import annotations

import json
import pickle
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.errors import RecipeError, UsageError, describe_exception, located

SB3_FIX = "pip install 'rlopt[sb3]'"

# algorithm name -> (distribution, class name)
ALGORITHMS: dict[str, tuple[str, str]] = {
    "PPO": ("stable_baselines3", "PPO"),
    "A2C": ("stable_baselines3", "A2C"),
    "DQN": ("stable_baselines3", "DQN"),
    "SAC": ("stable_baselines3", "SAC"),
    "TD3": ("stable_baselines3", "TD3"),
    "RecurrentPPO": ("sb3_contrib", "RecurrentPPO"),
    "MaskablePPO": ("sb3_contrib", "MaskablePPO"),
}

# the module of a saved policy class -> algorithm (None: actor-critic, told apart by the saved hyperparameters)
_POLICY_MODULES: dict[str, str | None] = {
    "stable_baselines3.common.policies": None,
    "stable_baselines3.dqn.policies": "DQN",
    "stable_baselines3.sac.policies": "SAC",
    "stable_baselines3.td3.policies": "TD3",
    "sb3_contrib.common.recurrent.policies": "RecurrentPPO",
    "sb3_contrib.common.maskable.policies": "MaskablePPO",
}


def _zero_schedule(_progress: float) -> float:
    return 0.0


# Saved entries that inference never needs: given here, SB3 does not unpickle them (schedules are callables,
# buffers and episode statistics are data). A replay buffer of one transition instead of buffer_size.
CUSTOM_OBJECTS: dict[str, Any] = {
    "learning_rate": 0.0,
    "lr_schedule": _zero_schedule,
    "clip_range": 0.2,
    "clip_range_vf": None,
    "exploration_schedule": _zero_schedule,
    "_last_obs": None,
    "_last_original_obs": None,
    "_last_episode_starts": None,
    "_last_lstm_states": None,
    "ep_info_buffer": None,
    "ep_success_buffer": None,
    "action_noise": None,
    "rollout_buffer_class": None,
    "rollout_buffer_kwargs": {},
    "replay_buffer_class": None,
    "replay_buffer_kwargs": {},
    "optimize_memory_usage": False,
    "train_freq": 1,
    "buffer_size": 1,
}


@dataclass
class ObsInput:
    """One observation input of the compiled graph: the raw observation as the environment emits it."""

    name: str                      # graph input name: "obs", or the Dict key
    key: str | None                # Dict key, None for a plain space
    space: Any                     # the saved (model-side) gymnasium space
    shape: tuple[int, ...]         # raw per-sample shape (the env's layout)
    dtype: str                     # raw dtype as the env emits it
    channel_last: bool = False     # the env emits HWC, the saved space is CHW: transpose in the graph
    norm: tuple[np.ndarray, np.ndarray] | None = None   # VecNormalize (mean, var), float64, raw layout
    range: tuple[int, int] | None = None                # inclusive value range of an integer input


@dataclass
class VecNormStats:
    """What VecNormalize applies to observations, read from its pickle without an environment."""

    path: Path
    clip_obs: float
    epsilon: float
    stats: dict[str | None, tuple[np.ndarray, np.ndarray]]   # key (None: plain space) -> (mean, var)
    env: Any = None                # the unpickled VecNormalize (no venv), for the reference `normalize_obs`


@dataclass
class Agent:
    """A loaded agent: the SB3 model plus what the compiled graph needs to know about its inputs."""

    algorithm: str
    model: Any                     # the stable_baselines3 BaseAlgorithm, on CPU, in eval mode
    zip_path: Path
    inputs: list[ObsInput]
    vecnormalize: VecNormStats | None = None
    env_id: str | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def policy(self) -> Any:
        return self.model.policy

    @property
    def observation_space(self) -> Any:
        return self.model.observation_space

    @property
    def action_space(self) -> Any:
        return self.model.action_space

    @property
    def recurrent(self) -> bool:
        return self.algorithm == "RecurrentPPO"

    @property
    def masked(self) -> bool:
        return self.algorithm == "MaskablePPO"

    @property
    def is_dict(self) -> bool:
        return self.inputs[0].key is not None

    @property
    def lstm_state_shape(self) -> tuple[int, int] | None:
        """(n_lstm_layers, hidden) of the actor's LSTM, for RecurrentPPO."""
        if not self.recurrent:
            return None
        lstm = self.policy.lstm_actor
        return int(lstm.num_layers), int(lstm.hidden_size)

    @property
    def n_mask(self) -> int | None:
        """Width of MaskablePPO's action mask."""
        if not self.masked:
            return None
        space = self.action_space
        if hasattr(space, "nvec"):
            return int(np.sum(space.nvec))
        return int(space.n) if hasattr(space, "n") else int(np.prod(space.shape)) * 2

    @property
    def value_reason(self) -> str | None:
        """Why there is no `value` network for this agent (None when there is one)."""
        if self.algorithm in ("SAC", "TD3"):
            return (f"{self.algorithm} has no state-value network: its critics are Q(s, a) functions of an action "
                    "that the policy chooses, not part of predict()")
        if self.recurrent:
            return ("RecurrentPPO's critic carries its own LSTM state, which predict() neither takes nor returns; "
                    "only the actor is compiled")
        return None

    def normalize(self, obs: Any) -> Any:
        """The observation as the policy sees it: VecNormalize applied (SB3's own `normalize_obs`), if any."""
        if self.vecnormalize is None:
            return obs
        return self.vecnormalize.env.normalize_obs(obs)

    def predict(self, obs: Any, *, state: Any = None, episode_start: Any = None, action_masks: Any = None) -> Any:
        """`model.predict(normalize(obs), deterministic=True)`: the reference the compiled actor reproduces."""
        kwargs: dict[str, Any] = {"state": state, "episode_start": episode_start, "deterministic": True}
        if self.masked:
            kwargs["action_masks"] = action_masks
        return self.model.predict(self.normalize(obs), **kwargs)


def _import(distribution: str, zip_path: Path) -> Any:
    import importlib

    try:
        return importlib.import_module(distribution)
    except ImportError as exc:
        raise UsageError(located(zip_path, "", f"loading a Stable-Baselines3 agent needs '{distribution}', "
                                 f"which could not be imported ({exc})", SB3_FIX)) from exc


def read_zip_data(zip_path: Path) -> dict[str, Any]:
    """The zip's `data` JSON, parsed but not unpickled; RecipeError unless it is an SB3 model zip."""
    if not zip_path.is_file():
        raise RecipeError(located(zip_path, "model.sb3", "no such file", "give the path of a model.save() zip"))
    not_sb3 = "not a Stable-Baselines3 model.save() zip"
    try:
        with zipfile.ZipFile(zip_path) as archive:
            names = set(archive.namelist())
            if "data" not in names or "policy.pth" not in names:
                raise RecipeError(located(zip_path, "model.sb3", f"{not_sb3} (no 'data' and 'policy.pth' inside)",
                                          "give the zip that model.save() wrote"))
            data = json.loads(archive.read("data"))
    except (zipfile.BadZipFile, OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise RecipeError(located(zip_path, "model.sb3", f"{not_sb3} ({describe_exception(exc)})",
                                  "give the zip that model.save() wrote")) from exc
    if not isinstance(data, dict):
        raise RecipeError(located(zip_path, "model.sb3", f"{not_sb3} ('data' is not a JSON object)",
                                  "give the zip that model.save() wrote"))
    return data


def detect_algorithm(data: dict[str, Any], zip_path: Path) -> str:
    """The algorithm that saved the zip, from its policy class's module and saved hyperparameters."""
    policy = data.get("policy_class")
    module = policy.get("__module__") if isinstance(policy, dict) else None
    supported = ", ".join(ALGORITHMS)
    if module not in _POLICY_MODULES:
        raise RecipeError(located(zip_path, "model.sb3",
                                  f"unknown algorithm: policy class from module '{module}' (supported: {supported})",
                                  "pass algorithm= (one of the supported names) if the agent is one of these with "
                                  "a custom policy class"))
    algorithm = _POLICY_MODULES[module]
    if algorithm is None:
        if "cg_max_steps" in data:
            raise RecipeError(located(zip_path, "model.sb3", f"unknown algorithm: TRPO (supported: {supported})",
                                      "pass algorithm='A2C' to load it as an actor-critic policy"))
        algorithm = "PPO" if "clip_range" in data else "A2C"
    return algorithm


def _algorithm_name(name: str, zip_path: Path) -> str:
    for known in ALGORITHMS:
        if known.lower() == name.lower():
            return known
    raise UsageError(located(zip_path, "algorithm", f"unknown algorithm '{name}'",
                             f"use one of {', '.join(ALGORITHMS)}"))


def load_vecnormalize(pkl_path: Path) -> VecNormStats:
    """VecNormalize statistics from `VecNormalize.save()`'s pickle, without an environment."""
    if not pkl_path.is_file():
        raise RecipeError(located(pkl_path, "model.vecnormalize", "no such file",
                                  "give the path VecNormalize.save() wrote"))
    _import("stable_baselines3", pkl_path)
    try:
        with pkl_path.open("rb") as handle:
            env = pickle.load(handle)
    except (pickle.UnpicklingError, EOFError, AttributeError, ImportError, ValueError, TypeError) as exc:
        raise RecipeError(located(pkl_path, "model.vecnormalize", f"not a VecNormalize pickle "
                                  f"({describe_exception(exc)})", "give the file VecNormalize.save() wrote")) from exc
    needed = ("obs_rms", "clip_obs", "epsilon", "norm_obs")
    if not all(hasattr(env, name) for name in needed):
        raise RecipeError(located(pkl_path, "model.vecnormalize", f"not a VecNormalize pickle "
                                  f"(a {type(env).__name__} without {', '.join(needed)})",
                                  "give the file VecNormalize.save() wrote"))
    stats: dict[str | None, tuple[np.ndarray, np.ndarray]] = {}
    if env.norm_obs:
        if isinstance(env.obs_rms, dict):
            for key in getattr(env, "norm_obs_keys", None) or list(env.obs_rms):
                rms = env.obs_rms[key]
                stats[key] = (np.asarray(rms.mean, np.float64), np.asarray(rms.var, np.float64))
        else:
            stats[None] = (np.asarray(env.obs_rms.mean, np.float64), np.asarray(env.obs_rms.var, np.float64))
    return VecNormStats(pkl_path, float(env.clip_obs), float(env.epsilon), stats, env)


def load_agent(zip_path: str | Path, *, vecnormalize: str | Path | None = None, algorithm: str | None = None,
               env: str | None = None) -> Agent:
    """Load an SB3 / sb3-contrib zip on CPU. `env` (a gymnasium id) tells the raw observation layout and dtypes;
    without it, channel-first image spaces are assumed to come from a channel-last env (SB3 transposes those)."""
    zip_path = Path(zip_path)
    data = read_zip_data(zip_path)
    name = _algorithm_name(algorithm, zip_path) if algorithm else detect_algorithm(data, zip_path)
    distribution, class_name = ALGORITHMS[name]
    _import("gymnasium", zip_path)
    package = _import(distribution, zip_path)
    cls = getattr(package, class_name)
    try:
        model = cls.load(zip_path, device="cpu", custom_objects=dict(CUSTOM_OBJECTS), print_system_info=False)
    except (ImportError, AttributeError, KeyError, ValueError, TypeError, RuntimeError, AssertionError, EOFError,
            pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        raise RecipeError(located(zip_path, "model.sb3", f"{class_name}.load failed: {describe_exception(exc)}",
                                  "load it with the stable-baselines3 version and custom code that saved it, "
                                  "or pass algorithm= if the detected one is wrong")) from exc
    model.policy.set_training_mode(False)
    stats = load_vecnormalize(Path(vecnormalize)) if vecnormalize is not None else None
    agent = Agent(name, model, zip_path, [], stats, env)
    agent.inputs = _observation_inputs(agent, _env_space(env, zip_path) if env else None)
    return agent


def _env_space(env_id: str, zip_path: Path) -> Any:
    gymnasium = _import("gymnasium", zip_path)
    try:
        env = gymnasium.make(env_id)
    except Exception as exc:  # gymnasium raises many types for a bad id or a broken entry point
        raise UsageError(located(env_id, "--env", f"gymnasium.make failed: {describe_exception(exc)}",
                                 "give a registered gymnasium id (import the package that registers it)")) from exc
    try:
        return env.observation_space
    finally:
        env.close()


def _observation_inputs(agent: Agent, env_space: Any) -> list[ObsInput]:
    from gymnasium import spaces

    saved = agent.observation_space
    where = agent.zip_path
    if isinstance(saved, spaces.Dict):
        if env_space is not None and (not isinstance(env_space, spaces.Dict) or list(env_space) != list(saved)):
            raise UsageError(located(agent.env_id, "--env", f"the env observes {env_space}, the agent {saved}",
                                     "give the env the agent was trained on"))
        items = [(key, sub, env_space[key] if env_space is not None else None) for key, sub in saved.spaces.items()]
    else:
        items = [(None, saved, env_space)]
    inputs = [_one_input(agent, key, sub, raw) for key, sub, raw in items]
    reserved = {"action_masks", "state_h", "state_c", "episode_start"}
    clash = [i.name for i in inputs if i.name in reserved]
    if clash:
        raise RecipeError(located(where, "observation_space", f"Dict key {clash[0]!r} clashes with an input rlopt "
                                  "adds", "rename the key in the environment"))
    stats = agent.vecnormalize
    if stats is not None:
        for obs in inputs:
            if obs.key in stats.stats:
                mean, var = stats.stats[obs.key]
                if tuple(mean.shape) != obs.shape:
                    raise RecipeError(located(stats.path, "model.vecnormalize", f"statistics of shape {mean.shape} "
                                              f"for an observation of shape {obs.shape}",
                                              "give the VecNormalize saved with this agent"))
                obs.norm = (mean, var)
    return inputs


def _one_input(agent: Agent, key: str | None, space: Any, raw: Any) -> ObsInput:
    from gymnasium import spaces
    from stable_baselines3.common.preprocessing import is_image_space

    name = "obs" if key is None else key
    if isinstance(space, spaces.Discrete):
        start = int(space.start)
        return ObsInput(name, key, space, (), "int64", range=(start, start + int(space.n) - 1))
    if isinstance(space, spaces.MultiDiscrete):
        return ObsInput(name, key, space, tuple(space.shape), "int64", range=(0, int(np.min(space.nvec)) - 1))
    if not isinstance(space, spaces.Box):
        raise RecipeError(located(agent.zip_path, "observation_space", f"{type(space).__name__} observations are "
                                  "not supported (Box, Discrete, MultiDiscrete and Dict of these are)",
                                  "wrap the env to emit a Box"))
    shape = tuple(int(d) for d in space.shape)
    dtype = np.dtype(raw.dtype if raw is not None else space.dtype).name
    if is_image_space(space) and len(shape) == 3:
        hwc = (shape[1], shape[2], shape[0])
        if raw is not None:
            raw_shape = tuple(raw.shape)
            if raw_shape not in (shape, hwc):
                raise UsageError(located(agent.env_id, "--env", f"the env emits {name} of shape {raw_shape}, the "
                                         f"agent expects {shape} (or {hwc} channel-last)", "give the agent's env"))
            channel_last = raw_shape == hwc and raw_shape != shape
        else:
            stats = agent.vecnormalize.stats.get(key) if agent.vecnormalize else None
            channel_last = stats is None or tuple(stats[0].shape) != shape
            how = "from the VecNormalize statistics" if stats is not None else "assumed; pass env= to decide"
            agent.notes.append(f"{name}: image input in {'channel-last' if channel_last else 'channel-first'} layout "
                               f"({how})")
        rng = (0, 255) if dtype == "uint8" else None
        return ObsInput(name, key, space, hwc if channel_last else shape, dtype, channel_last, range=rng)
    if raw is not None and tuple(raw.shape) != shape:
        raise UsageError(located(agent.env_id, "--env", f"the env emits {name} of shape {tuple(raw.shape)}, the "
                                 f"agent expects {shape}", "give the env the agent was trained on"))
    return ObsInput(name, key, space, shape, dtype)
