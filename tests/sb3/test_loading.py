"""Loading agents: algorithm detection, user errors as one located line, observation layouts, the recipe."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.sb3.conftest import agent_files

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")
torch = pytest.importorskip("torch")

from rlopt.errors import RecipeError, RloptError, UsageError  # noqa: E402
from rlopt.sb3 import (actor_inputs, actor_module, agent_model, agent_recipe, load_agent,  # noqa: E402
                       observation_feeds)

EXPECTED = {"ppo": "PPO", "a2c_vecnorm": "A2C", "sac": "SAC", "td3": "TD3", "dqn": "DQN", "dict": "PPO",
            "cnn": "PPO", "recurrent": "RecurrentPPO", "maskable": "MaskablePPO"}


def test_algorithm_read_from_the_zip(agents_dir: Path) -> None:
    for name, algorithm in EXPECTED.items():
        assert load_agent(agents_dir / f"{name}.zip").algorithm == algorithm, name


def one_line_error(exc: pytest.ExceptionInfo[RloptError], *words: str) -> str:
    text = str(exc.value)
    assert "\n" not in text and "fix: " in text, text
    for word in words:
        assert word in text, text
    return text


def test_user_errors_are_located_one_liners(agents_dir: Path, tmp_path: Path,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(RecipeError) as exc:
        load_agent(tmp_path / "nope.zip")
    one_line_error(exc, "nope.zip", "no such file")
    (tmp_path / "text.zip").write_text("hello")
    with pytest.raises(RecipeError) as exc:
        load_agent(tmp_path / "text.zip")
    one_line_error(exc, "not a Stable-Baselines3")
    with zipfile.ZipFile(tmp_path / "other.zip", "w") as archive:
        archive.writestr("weights.bin", b"0")
    with pytest.raises(RecipeError) as exc:
        load_agent(tmp_path / "other.zip")
    one_line_error(exc, "other.zip", "no 'data'")
    with zipfile.ZipFile(tmp_path / "qrdqn.zip", "w") as archive:
        archive.writestr("data", json.dumps({"policy_class": {"__module__": "sb3_contrib.qrdqn.policies"}}))
        archive.writestr("policy.pth", b"")
    with pytest.raises(RecipeError) as exc:
        load_agent(tmp_path / "qrdqn.zip")
    one_line_error(exc, "unknown algorithm", "sb3_contrib.qrdqn.policies", "MaskablePPO")
    with pytest.raises(UsageError) as exc:
        load_agent(agents_dir / "ppo.zip", algorithm="PPG")
    one_line_error(exc, "unknown algorithm 'PPG'")
    with pytest.raises(RecipeError) as exc:
        load_agent(agents_dir / "ppo.zip", algorithm="DQN")   # forced, and wrong: SB3's error, one line
    one_line_error(exc, "DQN.load failed")


def test_vecnormalize_errors(agents_dir: Path, tmp_path: Path) -> None:
    with pytest.raises(RecipeError) as exc:
        load_agent(agents_dir / "ppo.zip", vecnormalize=tmp_path / "stats.pkl")
    one_line_error(exc, "stats.pkl", "no such file")
    (tmp_path / "junk.pkl").write_bytes(b"not a pickle")
    with pytest.raises(RecipeError) as exc:
        load_agent(agents_dir / "ppo.zip", vecnormalize=tmp_path / "junk.pkl")
    one_line_error(exc, "junk.pkl", "not a VecNormalize pickle")
    with pytest.raises(RecipeError) as exc:   # Pendulum's statistics for a CartPole agent
        load_agent(agents_dir / "ppo.zip", vecnormalize=agents_dir / "a2c_vecnorm.pkl")
    one_line_error(exc, "statistics of shape (3,)", "(4,)")


def test_env_errors(agents_dir: Path) -> None:
    with pytest.raises(UsageError) as exc:
        load_agent(agents_dir / "ppo.zip", env="Pendulum-v1")
    one_line_error(exc, "Pendulum-v1", "shape (3,)")
    with pytest.raises(UsageError) as exc:
        load_agent(agents_dir / "ppo.zip", env="NoSuchEnv-v9")
    one_line_error(exc, "NoSuchEnv-v9", "gymnasium.make failed")


def test_missing_sb3_extra_names_the_install(agents_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "sb3_contrib", None)
    with pytest.raises(UsageError) as exc:
        load_agent(agents_dir / "maskable.zip")
    one_line_error(exc, "sb3_contrib", "pip install 'rlopt[sb3]'")


def test_image_layout_follows_the_env(agents_dir: Path) -> None:
    from tests.sb3.conftest import ENVS, gymnasium

    if "rlopt-test/MultiObsChannelFirst-v0" not in gymnasium.registry:
        gymnasium.register("rlopt-test/MultiObsChannelFirst-v0", entry_point=ENVS["rlopt-test/MultiObs-v0"][0],
                           kwargs={"channel_last": False})
    zip_path = agents_dir / "dict.zip"
    assumed = load_agent(zip_path)
    assert [(i.name, i.shape, i.dtype) for i in assumed.inputs] == [("img", (64, 64, 1), "uint8"),
                                                                     ("vec", (5,), "float64")]
    assert any("assumed" in note for note in assumed.notes)
    first = load_agent(zip_path, env="rlopt-test/MultiObsChannelFirst-v0")
    assert first.inputs[0].shape == (1, 64, 64) and not first.inputs[0].channel_last and not first.notes
    # one observation, in either layout, through either graph: the same action as predict
    env = gymnasium.make("rlopt-test/MultiObsChannelFirst-v0")
    obs, _ = env.reset(seed=3)
    reference, _ = first.predict({k: v[None] for k, v in obs.items()})
    feeds = observation_feeds(first, obs)
    with torch.no_grad():
        got_first = actor_module(first)(*[torch.from_numpy(feeds[n]) for n in actor_inputs(first)])
        hwc = torch.from_numpy(feeds["img"]).permute(0, 2, 3, 1).contiguous()
        got_last = actor_module(assumed)(hwc, torch.from_numpy(feeds["vec"]))
    np.testing.assert_array_equal(got_first.numpy(), reference)
    np.testing.assert_array_equal(got_last.numpy(), reference)
    with pytest.raises(UsageError) as exc:   # a channel-first env fed to the channel-last graph
        observation_feeds(assumed, obs)
    one_line_error(exc, "img", "(1, 64, 64)", "env=")


def test_recipes(agents_dir: Path) -> None:
    def recipe(name: str, **kwargs: object) -> dict:
        zip_path, pkl, env_id = agent_files(agents_dir, name)
        agent = load_agent(zip_path, vecnormalize=pkl, env=env_id)
        content = agent_recipe(agent, zip_path, pkl, **kwargs)
        assert list(content["networks"]["actor"]["inputs"]) == actor_inputs(agent)   # forward's order
        assert content["verify"] == {"rollout": {"env": env_id, "steps": 1000, "seed": 0}}
        return content

    ppo = recipe("ppo")
    assert ppo["name"] == "ppo" and ppo["model"] == {"sb3": str(agents_dir / "ppo.zip")}
    assert ppo["networks"]["actor"] == {
        "module": "actor", "kind": "generic", "outputs": ["action"],
        "inputs": {"obs": {"dtype": "float32", "min": [1, 4], "opt": [64, 4], "max": [256, 4]}}}
    assert ppo["networks"]["value"]["outputs"] == ["value"] and ppo["networks"]["value"]["kind"] == "value"
    assert recipe("a2c_vecnorm")["model"]["vecnormalize"] == str(agents_dir / "a2c_vecnorm.pkl")
    assert recipe("dqn")["networks"]["value"]["outputs"] == ["q_values"]
    assert "value" not in recipe("sac")["networks"]
    rec = recipe("recurrent", batch=(1, 8, 32))["networks"]
    assert "value" not in rec and rec["actor"]["state"] == {"state_h": "next_state_h", "state_c": "next_state_c"}
    assert rec["actor"]["outputs"] == ["action", "next_state_h", "next_state_c"]
    assert rec["actor"]["inputs"]["state_h"] == {"dtype": "float32", "min": [1, 2, 16], "opt": [8, 2, 16],
                                                 "max": [32, 2, 16]}
    assert rec["actor"]["inputs"]["episode_start"] == {"dtype": "float32", "min": [1], "opt": [8], "max": [32]}
    masked = recipe("maskable")["networks"]["actor"]["inputs"]
    assert masked["obs"] == {"dtype": "int64", "min": [1], "opt": [64], "max": [256], "range": [0, 7]}
    assert masked["action_masks"] == {"dtype": "bool", "min": [1, 8], "opt": [64, 8], "max": [256, 8]}
    multi = recipe("dict")["networks"]["actor"]["inputs"]
    assert multi["img"] == {"dtype": "uint8", "min": [1, 64, 64, 1], "opt": [64, 64, 64, 1],
                            "max": [256, 64, 64, 1], "range": [0, 255]}
    assert multi["vec"]["dtype"] == "float64"
    assert recipe("cnn")["networks"]["actor"]["inputs"]["obs"]["min"] == [1, 40, 40, 3]


def test_agent_model_holds_the_recipe_modules(agents_dir: Path) -> None:
    model = agent_model(load_agent(agents_dir / "ppo.zip"))
    assert isinstance(model.actor, torch.nn.Module) and isinstance(model.value, torch.nn.Module)
    assert not hasattr(agent_model(load_agent(agents_dir / "td3.zip")), "value")
    assert not any(p.requires_grad for p in model.parameters())


class UnscriptableExtractor(torch.nn.Module):
    """A custom features extractor TorchScript cannot compile (a Python object in forward)."""

    def __init__(self, observation_space: object, features_dim: int = 4) -> None:
        super().__init__()
        self.features_dim = features_dim
        self.lookup = {"scale": 2.0}

    def forward(self, x):  # noqa: ANN001, ANN201 - untyped on purpose
        return x * self.lookup["scale"] if isinstance(self.lookup, dict) else x


def test_unscriptable_component_is_named(tmp_path: Path) -> None:
    from stable_baselines3 import PPO

    from rlopt.sb3 import script

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=16, batch_size=16, device="cpu", seed=0,
                policy_kwargs={"features_extractor_class": UnscriptableExtractor, "net_arch": [8]})
    model.save(tmp_path / "custom.zip")
    agent = load_agent(tmp_path / "custom.zip")
    actor = actor_module(agent)
    with torch.no_grad():   # eager is fine
        actor(torch.zeros(2, 4))
    with pytest.raises(RecipeError) as exc:
        script(actor, agent)
    one_line_error(exc, "custom.zip", "UnscriptableExtractor at actor.path0.1", "cannot be scripted")


def test_multidiscrete_observations_and_actions(tmp_path: Path) -> None:
    """MultiDiscrete sizes are numpy ints in SB3's modules (nn.Linear.in_features): the graph still scripts."""
    from stable_baselines3 import PPO

    from rlopt.sb3 import rollout_check, script
    from tests.sb3.conftest import gymnasium

    if "rlopt-test/MultiDiscrete-v0" not in gymnasium.registry:
        gymnasium.register("rlopt-test/MultiDiscrete-v0",
                           entry_point="stable_baselines3.common.envs:IdentityEnvMultiDiscrete", kwargs={"dim": 3})
    PPO("MlpPolicy", "rlopt-test/MultiDiscrete-v0", device="cpu", seed=0,
        policy_kwargs={"net_arch": [8]}).save(tmp_path / "md.zip")
    agent = load_agent(tmp_path / "md.zip", env="rlopt-test/MultiDiscrete-v0")
    scripted = script(actor_module(agent), agent)
    report = rollout_check(agent, "rlopt-test/MultiDiscrete-v0", steps=30,
                           infer=lambda feeds: scripted(torch.from_numpy(feeds["obs"])).numpy())
    assert report.passed and report.reference_actions.shape == (30, 2), report.summary()


def test_entries_inference_does_not_need_are_never_unpickled(agents_dir: Path, tmp_path: Path) -> None:
    """Every serialized entry rlopt passes as `custom_objects` is replaced by a pickle that fails when loaded
    (a global from a module that does not exist): SB3's own load fails on it, rlopt's never unpickles it."""
    import base64

    from stable_baselines3 import PPO

    from rlopt.sb3.agent import CUSTOM_OBJECTS

    poisoned = base64.b64encode(b"crlopt_no_such_module\nboom\n.").decode()
    source, target = agents_dir / "ppo.zip", tmp_path / "ppo.zip"
    replaced = []
    with zipfile.ZipFile(source) as old, zipfile.ZipFile(target, "w") as new:
        for item in old.infolist():
            content = old.read(item.filename)
            if item.filename == "data":
                data = json.loads(content)
                for key, value in data.items():
                    if key in CUSTOM_OBJECTS and isinstance(value, dict) and ":serialized:" in value:
                        value[":serialized:"] = poisoned
                        replaced.append(key)
                content = json.dumps(data).encode()
            new.writestr(item, content)
    assert {"lr_schedule", "clip_range", "rollout_buffer_class", "_last_obs"} <= set(replaced)
    with pytest.raises(ImportError, match="rlopt_no_such_module"):
        PPO.load(target, device="cpu")
    agent = load_agent(target)
    assert agent.algorithm == "PPO" and agent.model.lr_schedule(1.0) == 0.0
