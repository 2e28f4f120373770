"""The rollout report: a backend that acts differently fails, named by step; nothing compared never passes."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")
pytest.importorskip("sb3_contrib")
torch = pytest.importorskip("torch")

from rlopt.errors import UsageError  # noqa: E402
from rlopt.sb3 import load_agent, rollout_check  # noqa: E402


def test_wrong_discrete_actions_fail_with_the_steps(agents_dir: Path) -> None:
    agent = load_agent(agents_dir / "ppo.zip")
    report = rollout_check(agent, "CartPole-v1", steps=40, infer=lambda feeds: 1 - agent.predict(feeds["obs"])[0])
    assert not report.passed and report.disagreed > 0 and report.agreed == report.ties
    assert report.disagreed + report.ties == 40
    first = report.first_disagreements[0]
    assert first.got == [1 - first.reference[0]] and first.margin is not None and first.margin > 1e-4
    summary = json.loads(json.dumps(report.summary(), allow_nan=False))
    assert summary["passed"] is False and summary["steps"] == 40 and len(summary["first_disagreements"]) <= 5
    assert report.inputs["obs"].shape == (40, 4) and report.reference_actions.shape == (40,)


def test_continuous_actions_within_atol(agents_dir: Path) -> None:
    agent = load_agent(agents_dir / "td3.zip")

    def shifted(shift: float):  # noqa: ANN202
        return lambda feeds: agent.predict(feeds["obs"])[0] + np.float32(shift)

    close = rollout_check(agent, "Pendulum-v1", steps=20, infer=shifted(5e-5))
    assert close.passed and 4e-5 < close.max_abs_diff < 6e-5
    far = rollout_check(agent, "Pendulum-v1", steps=20, infer=shifted(1e-3), atol=1e-4)
    assert not far.passed and far.disagreed == 20 and far.summary()["max_abs_diff"] == pytest.approx(1e-3, rel=1e-2)


def test_nothing_compared_does_not_pass(agents_dir: Path) -> None:
    agent = load_agent(agents_dir / "ppo.zip")
    report = rollout_check(agent, "CartPole-v1", steps=0, infer=lambda feeds: np.zeros(1, np.int64))
    assert report.steps == 0 and not report.passed


def test_recurrent_infer_must_return_the_state(agents_dir: Path) -> None:
    agent = load_agent(agents_dir / "recurrent.zip")
    with pytest.raises(UsageError, match="next_state_h"):
        rollout_check(agent, "CartPole-v1", steps=2, infer=lambda feeds: np.zeros(1, np.int64))


def test_bad_env_id_is_one_line(agents_dir: Path) -> None:
    agent = load_agent(agents_dir / "ppo.zip")
    with pytest.raises(UsageError) as exc:
        rollout_check(agent, "NoSuchEnv-v3", steps=2, infer=lambda feeds: np.zeros(1, np.int64))
    assert "\n" not in str(exc.value) and "verify.rollout.env" in str(exc.value) and "fix: " in str(exc.value)
