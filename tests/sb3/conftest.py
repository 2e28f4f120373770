"""Tiny SB3 / sb3-contrib agents, trained in-process once and cached (zips under pytest's cache directory).

Nothing is downloaded: every env is gymnasium's classic control or a test env shipped with SB3 / sb3-contrib,
registered here under an id so rollouts can `gymnasium.make` it.
"""

from __future__ import annotations

import fcntl
import hashlib
import inspect
import os
import warnings
from pathlib import Path
from typing import Any

import pytest

try:   # without the sb3 extra, the test modules skip themselves (pytest.importorskip); this file must still import
    import gymnasium
    import sb3_contrib  # noqa: F401
    import stable_baselines3  # noqa: F401
except ImportError:
    gymnasium = None

ENVS = {
    "rlopt-test/MultiObs-v0": ("stable_baselines3.common.envs:SimpleMultiObsEnv", {}),
    "rlopt-test/FakeImage-v0": ("stable_baselines3.common.envs:FakeImageEnv",
                                {"screen_height": 40, "screen_width": 40, "n_channels": 3, "discrete": False}),
    "rlopt-test/InvalidAction-v0": ("sb3_contrib.common.envs:InvalidActionEnvDiscrete",
                                    {"dim": 8, "n_invalid_actions": 3}),
}
for _id, (_entry, _kwargs) in ENVS.items():
    if gymnasium is not None and _id not in gymnasium.registry:
        gymnasium.register(_id, entry_point=_entry, kwargs=_kwargs)

# name -> (algorithm, policy, env id, constructor kwargs, timesteps, vecnormalize)
AGENTS: dict[str, tuple[str, str, str, dict[str, Any], int, bool]] = {
    "ppo": ("PPO", "MlpPolicy", "CartPole-v1", {"n_steps": 64, "batch_size": 64, "n_epochs": 1}, 128, False),
    "a2c_vecnorm": ("A2C", "MlpPolicy", "Pendulum-v1", {"n_steps": 16}, 160, True),
    "sac": ("SAC", "MlpPolicy", "Pendulum-v1", {"learning_starts": 80, "batch_size": 32}, 100, False),
    "td3": ("TD3", "MlpPolicy", "Pendulum-v1", {"learning_starts": 80, "batch_size": 32}, 100, False),
    "dqn": ("DQN", "MlpPolicy", "CartPole-v1", {"learning_starts": 100, "batch_size": 32}, 200, False),
    "dict": ("PPO", "MultiInputPolicy", "rlopt-test/MultiObs-v0", {"n_steps": 32, "batch_size": 32, "n_epochs": 1},
             32, False),
    "cnn": ("PPO", "CnnPolicy", "rlopt-test/FakeImage-v0", {"n_steps": 32, "batch_size": 32, "n_epochs": 1}, 32,
            False),
    "recurrent": ("RecurrentPPO", "MlpLstmPolicy", "CartPole-v1",
                  {"n_steps": 32, "batch_size": 32, "n_epochs": 1,
                   "policy_kwargs": {"lstm_hidden_size": 16, "n_lstm_layers": 2, "net_arch": [16]}}, 64, False),
    "maskable": ("MaskablePPO", "MlpPolicy", "rlopt-test/InvalidAction-v0",
                 {"n_steps": 32, "batch_size": 32, "n_epochs": 1}, 64, False),
}
SMALL_NET = {"net_arch": [32, 32]}


def _train(name: str, folder: Path) -> None:
    import copy

    import sb3_contrib
    import stable_baselines3
    from stable_baselines3.common.env_util import make_vec_env
    from stable_baselines3.common.logger import Logger
    from stable_baselines3.common.vec_env import VecNormalize

    algorithm, policy, env_id, kwargs, steps, vecnormalize = AGENTS[name]
    kwargs = copy.deepcopy(kwargs)   # SB3 mutates policy_kwargs
    kwargs.setdefault("policy_kwargs", dict(SMALL_NET) if policy != "CnnPolicy" else {"net_arch": [16]})
    if policy == "CnnPolicy":
        kwargs["policy_kwargs"]["features_extractor_kwargs"] = {"features_dim": 32}
    cls = getattr(stable_baselines3, algorithm, None) or getattr(sb3_contrib, algorithm)
    env = make_vec_env(env_id, n_envs=1, seed=0)
    if vecnormalize:
        env = VecNormalize(env)
    model = cls(policy, env, seed=0, device="cpu", **kwargs)
    model.set_logger(Logger(None, []))  # SB3's default logger leaves an empty SB3-<time> folder in /tmp
    model.learn(steps)
    model.save(folder / f"{name}.zip")
    if vecnormalize:
        env.save(str(folder / f"{name}.pkl"))
    env.close()


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread() -> Any:
    """Tiny networks: one thread is fastest, and on a shared machine two threads can be 100x slower."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture(scope="session")
def agents_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every agent of AGENTS trained once; reused across sessions while the specs and versions stay the same."""
    import sb3_contrib
    import stable_baselines3
    import torch

    key = hashlib.sha256((inspect.getsource(_train) + repr(AGENTS) + repr(ENVS) + stable_baselines3.__version__
                          + sb3_contrib.__version__ + torch.__version__).encode()).hexdigest()[:12]
    cache = getattr(request.config, "cache", None)   # absent under -p no:cacheprovider: train into the run's temp dir
    if cache:
        folder = Path(cache.mkdir(f"rlopt-sb3-agents-{key}"))
    elif os.environ.get("PYTEST_XDIST_WORKER"):  # the workers of one run share it, as they share the stage cache
        folder = tmp_path_factory.getbasetemp().parent / f"rlopt-sb3-agents-{key}"
        folder.mkdir(exist_ok=True)
    else:
        folder = tmp_path_factory.mktemp("sb3-agents")
    threads = torch.get_num_threads()
    # a session fixture is set up before the module's one_torch_thread: training on two threads under a busy
    # machine took 45 s here instead of 3 s
    torch.set_num_threads(1)
    try:
        with open(folder / "train.lock", "w") as lock, warnings.catch_warnings():  # xdist workers train once
            fcntl.flock(lock, fcntl.LOCK_EX)
            warnings.simplefilter("ignore")
            for name in AGENTS:
                if not (folder / f"{name}.zip").is_file():
                    _train(name, folder)
    finally:
        torch.set_num_threads(threads)
    return folder


def agent_files(folder: Path, name: str) -> tuple[Path, Path | None, str]:
    """(zip, vecnormalize pickle or None, env id) of a trained agent."""
    pkl = folder / f"{name}.pkl"
    return folder / f"{name}.zip", pkl if pkl.is_file() else None, AGENTS[name][2]
