"""The `sb3 predict` bench candidate on a MODEL_DIR compiled from an agent zip (scripts/bench_models.train_ppo)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.manifest import read_manifest
from rlopt.tools.bench import Skip
from rlopt.tools.bench.candidates import OPENERS, candidate_specs, load_reference
from tests.conftest import run_rlopt
from tests.tools.common import CORES

pytest.importorskip("stable_baselines3")
pytestmark = pytest.mark.slow  # trains and compiles an agent: tens of seconds


@pytest.fixture(scope="module")
def ppo_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = Path(__file__).parents[2] / "scripts" / "bench_models.py"
    spec = importlib.util.spec_from_file_location("rlopt_bench_models", path)
    assert spec is not None and spec.loader is not None
    models = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = models  # dataclasses look their module up while the class is made
    spec.loader.exec_module(models)
    folder = tmp_path_factory.mktemp("sb3-bench")
    models.train_ppo(folder / "agent.zip", timesteps=128)
    proc = run_rlopt("compile", str(folder / "agent.zip"), "-o", str(folder / "out"), cwd=folder)
    assert proc.returncode == 0, proc.stderr
    return folder / "out"


def test_the_actor_is_benched_against_sb3_predict_and_the_value_net_says_why_not(ppo_dir: Path) -> None:
    manifest = read_manifest(ppo_dir)
    actor = [s.name for s in candidate_specs(ppo_dir, manifest, "actor", None, False, CORES, [], protocol=True)]
    assert "sb3 predict" in actor and "pytorch eager" not in actor
    skipped: list[Skip] = []
    value = [s.name for s in candidate_specs(ppo_dir, manifest, "value", None, False, CORES, skipped, protocol=True)]
    assert "sb3 predict" not in value
    assert "its actor is benched against 'sb3 predict'" in {s.candidate: s.reason for s in skipped}["pytorch eager"]


def test_sb3_predict_returns_the_actions_the_compiled_actor_returns(ppo_dir: Path) -> None:
    manifest = read_manifest(ppo_dir)
    [spec] = [s for s in candidate_specs(ppo_dir, manifest, "actor", None, False, CORES, []) if s.kind == "sb3"]
    opened = OPENERS["sb3"](spec)
    feeds = load_reference(ppo_dir, manifest.networks["actor"]).feeds("opt", 0)
    actions, _ = opened.prepare(feeds)()
    compiled = rlopt.load(ppo_dir, "actor").run(feeds)
    [ours] = compiled.values() if isinstance(compiled, dict) else [compiled]
    assert actions.shape == (64,) and np.array_equal(np.asarray(ours).reshape(-1), actions)
