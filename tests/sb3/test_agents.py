"""Every supported algorithm (+ CNN, Dict, VecNormalize): the actor graph, eager, scripted and through ONNX
Runtime, acts as `model.predict(obs, deterministic=True)` does along a rollout of the agent's own env."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from tests.sb3.conftest import AGENTS, agent_files

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")
torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")

from rlopt.sb3 import (actor_inputs, actor_module, actor_outputs, load_agent, rollout_check, script,  # noqa: E402
                       value_module, value_outputs)

STEPS = 100   # per agent in the default suite; 1000 each under -m slow
DEFAULT = ("ppo", "a2c_vecnorm", "recurrent", "maskable")   # one per behaviour; the rest run under -m slow


def some_slow(names: list[str] | tuple[str, ...], default: tuple[str, ...] = DEFAULT) -> list[object]:
    return [name if name in default else pytest.param(name, marks=pytest.mark.slow) for name in names]
_CACHE: dict[str, Any] = {}


def export_onnx(scripted: Any, names: list[str], outputs: list[str], feeds: dict[str, np.ndarray],
                path: Path) -> Any:
    """As rlopt compiles: the scripted module through the TorchScript ONNX exporter, dynamic batch dim."""
    args = tuple(torch.from_numpy(feeds[n][:2]) for n in names)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(scripted, args, str(path), dynamo=False, input_names=names, output_names=outputs,
                          dynamic_axes={n: {0: "batch"} for n in names + outputs})
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


def run_torch(module: Any, names: list[str], feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    with torch.no_grad():
        out = module(*[torch.from_numpy(np.ascontiguousarray(feeds[n])) for n in names])
    return [o.numpy() for o in (out if isinstance(out, tuple) else (out,))]


def rollout(name: str, agents_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Load, build, script and export the actor once per agent; roll out with ONNX Runtime as the backend."""
    if name not in _CACHE:
        zip_path, pkl, env_id = agent_files(agents_dir, name)
        agent = load_agent(zip_path, vecnormalize=pkl, env=env_id)
        actor = actor_module(agent)
        scripted = script(actor, agent)
        names, outputs = actor_inputs(agent), actor_outputs(agent)
        probe = rollout_check(agent, env_id, infer=lambda f: dict(zip(outputs, run_torch(actor, names, f))), steps=2)
        sess = export_onnx(scripted, names, outputs, probe.inputs, tmp_path_factory.mktemp(name) / "actor.onnx")
        report = rollout_check(agent, env_id, steps=STEPS, seed=1,
                               infer=lambda feeds: dict(zip(outputs, sess.run(outputs, feeds))))
        _CACHE[name] = {"agent": agent, "actor": actor, "scripted": scripted, "session": sess, "names": names,
                        "outputs": outputs, "report": report}
    return _CACHE[name]


def assert_actions(agent: Any, reference: np.ndarray, got: np.ndarray) -> None:
    assert got.shape == reference.shape and got.dtype == reference.dtype, (got.shape, got.dtype, reference.dtype)
    if np.issubdtype(reference.dtype, np.integer):
        np.testing.assert_array_equal(got, reference)
    else:
        np.testing.assert_allclose(got, reference, rtol=0, atol=1e-4)


@pytest.mark.parametrize("name", some_slow(list(AGENTS)))
def test_actor_matches_predict_eager_scripted_and_onnxruntime(name: str, agents_dir: Path,
                                                                tmp_path_factory: pytest.TempPathFactory) -> None:
    case = rollout(name, agents_dir, tmp_path_factory)
    agent, report = case["agent"], case["report"]
    assert report.passed, report.summary()
    assert report.steps == STEPS and report.agreed == STEPS
    # the visited inputs, as one batch, through eager and TorchScript: predict's action at every step
    for module in (case["actor"], case["scripted"]):
        outs = run_torch(module, case["names"], report.inputs)
        assert_actions(agent, report.reference_actions, outs[0])
    expected_dtype = np.int64 if name in ("ppo", "dqn", "dict", "recurrent", "maskable") else np.float32
    assert report.reference_actions.dtype == expected_dtype


def test_vecnormalize_agent_acts_from_raw_observations(agents_dir: Path,
                                                       tmp_path_factory: pytest.TempPathFactory) -> None:
    case = rollout("a2c_vecnorm", agents_dir, tmp_path_factory)
    agent, report = case["agent"], case["report"]
    assert agent.inputs[0].norm is not None and report.passed
    raw = report.inputs["obs"]
    assert np.abs(raw).max() > 1.5, "the feeds are the env's raw observations (Pendulum's velocity spans [-8, 8])"
    # without the normalization step the same graph acts differently: the statistics are really in it
    agent.inputs[0].norm = None
    try:
        plain = run_torch(actor_module(agent), ["obs"], report.inputs)[0]
    finally:
        agent.inputs[0].norm = agent.vecnormalize.stats[None]
    assert not np.allclose(plain, report.reference_actions, atol=1e-3)


def test_recurrent_state_fed_back_over_episodes(agents_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    case = rollout("recurrent", agents_dir, tmp_path_factory)
    report = case["report"]
    assert report.passed and report.episodes >= 2, report.summary()
    starts = report.inputs["episode_start"]
    assert starts.dtype == np.float32 and starts[0] == 1.0 and 2 <= starts.sum() < len(starts)
    assert report.inputs["state_h"].shape == (STEPS, 2, 16)    # [batch, n_lstm_layers, hidden]
    # a reset really zeroes the state: same obs, garbage state, episode_start 1 == zero state
    feeds = {k: v[:1].copy() for k, v in report.inputs.items()}
    feeds["state_h"][:] = 5.0
    feeds["state_c"][:] = -5.0
    reset = run_torch(case["actor"], case["names"], feeds)
    feeds["state_h"][:] = 0.0
    feeds["state_c"][:] = 0.0
    zero = run_torch(case["actor"], case["names"], feeds)
    for a, b in zip(reset, zero):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("name", some_slow(["ppo", "a2c_vecnorm", "dqn", "dict", "cnn", "maskable"], ("ppo",)))
def test_value_network_matches_sb3(name: str, agents_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> None:
    case = rollout(name, agents_dir, tmp_path_factory)
    agent, report = case["agent"], case["report"]
    names = [obs.name for obs in agent.inputs]
    obs = {n: report.inputs[n][:64] for n in names}
    batch = obs["obs"] if not agent.is_dict else {i.key: obs[i.name] for i in agent.inputs}
    obs_t, _ = agent.policy.obs_to_tensor(agent.normalize(batch))
    with torch.no_grad():
        expected = (agent.policy.q_net(obs_t) if agent.algorithm == "DQN" else agent.policy.predict_values(obs_t))
    value = value_module(agent)
    scripted = script(value, agent, "value")
    for module in (value, scripted):
        np.testing.assert_allclose(run_torch(module, names, obs)[0], expected.numpy(), rtol=1e-5, atol=1e-5)
    if name in ("ppo", "dqn", "dict"):   # the observation paths are the actor's, through ONNX Runtime above
        sess = export_onnx(scripted, names, value_outputs(agent), obs, tmp_path_factory.mktemp("v") / "value.onnx")
        np.testing.assert_allclose(sess.run(None, obs)[0], expected.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["sac", "td3", "recurrent"])
def test_no_value_network_says_why(name: str, agents_dir: Path) -> None:
    zip_path, _, _ = agent_files(agents_dir, name)
    agent = load_agent(zip_path)
    assert value_module(agent) is None
    assert agent.value_reason and agent.algorithm in agent.value_reason


@pytest.mark.slow
@pytest.mark.parametrize("name", list(AGENTS))
def test_thousand_step_rollout_through_onnxruntime(name: str, agents_dir: Path,
                                                   tmp_path_factory: pytest.TempPathFactory) -> None:
    case = rollout(name, agents_dir, tmp_path_factory)
    _, _, env_id = agent_files(agents_dir, name)
    sess, outputs = case["session"], case["outputs"]
    report = rollout_check(case["agent"], env_id, steps=1000, seed=0,
                           infer=lambda feeds: dict(zip(outputs, sess.run(outputs, feeds))))
    assert report.passed, report.summary()
