"""Refit of a MODEL_DIR compiled from an SB3 zip: a new zip of the same agent (and VecNormalize statistics)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("stable_baselines3")

import rlopt  # noqa: E402
from rlopt.errors import UsageError  # noqa: E402
from tests.sb3.conftest import agent_files, agents_dir, one_torch_thread  # noqa: E402,F401

pytestmark = pytest.mark.slow
BACKENDS = ["torchscript", "onnxruntime"]


def _new_agent(zip_path: Path, pkl: Path | None, folder: Path) -> tuple[Path, Path | None]:
    """The same agent after a 'training step': every policy parameter moved, the observation statistics too."""
    import pickle

    import torch
    from stable_baselines3.common.base_class import BaseAlgorithm

    from rlopt.sb3 import load_agent

    algorithm = load_agent(zip_path).algorithm
    import sb3_contrib
    import stable_baselines3

    cls: type[BaseAlgorithm] = getattr(stable_baselines3, algorithm, None) or getattr(sb3_contrib, algorithm)
    model = cls.load(zip_path, device="cpu")
    generator = torch.Generator().manual_seed(11)
    with torch.no_grad():
        for parameter in model.policy.parameters():
            parameter.add_(0.05 * torch.randn(parameter.shape, generator=generator))
    new_zip = folder / "new_agent.zip"
    model.save(new_zip)
    if pkl is None:
        return new_zip, None
    stats = pickle.loads(pkl.read_bytes())
    stats.obs_rms.mean = stats.obs_rms.mean + 0.25
    stats.__dict__.update(venv=None, class_attributes={}, returns=None)  # what VecNormalize's pickling drops
    new_pkl = folder / "new_stats.pkl"
    new_pkl.write_bytes(pickle.dumps(stats))
    return new_zip, new_pkl


def _outputs(model_dir: Path, backend: str, obs: np.ndarray) -> dict[str, np.ndarray]:
    from rlopt.manifest import read_manifest

    name = next(iter(read_manifest(model_dir).networks["actor"].inputs))
    with rlopt.load(model_dir, "actor", backend=backend) as sess:
        return sess.run({name: obs})


@pytest.mark.parametrize("name", ["ppo", "a2c_vecnorm"])
def test_refit_from_a_new_zip_equals_a_fresh_compile(name: str, agents_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    from rlopt.compile import compile_agent
    from rlopt.refit import refit_model_dir

    zip_path, pkl, _ = agent_files(agents_dir, name)
    old = compile_agent(zip_path, tmp_path / "old", vecnormalize=pkl, backends=BACKENDS).model_dir
    new_zip, new_pkl = _new_agent(zip_path, pkl, tmp_path)
    refitted = refit_model_dir(old, new_zip, tmp_path / "refitted", vecnormalize=new_pkl)
    assert refitted.passed, refitted.failures
    fresh = compile_agent(new_zip, tmp_path / "fresh", vecnormalize=new_pkl, backends=BACKENDS).model_dir
    spec = refitted.manifest.networks["actor"].inputs
    obs = np.random.default_rng(0).standard_normal([3, *spec[next(iter(spec))].opt[1:]]).astype(np.float32)
    for backend in BACKENDS:
        got, want, before = _outputs(refitted.model_dir, backend, obs), _outputs(fresh, backend, obs), \
            _outputs(old, backend, obs)
        for key, value in want.items():
            np.testing.assert_allclose(got[key], value, atol=1e-5, rtol=1e-5)
            assert not np.allclose(before[key], value, atol=1e-4)
    actor = refitted.manifest.networks["actor"]
    assert actor.kind == "generic" and actor.drift is None  # the actor returns actions: drift is for kind policy


def test_state_dict_for_an_agent_dir_is_refused(agents_dir: Path, tmp_path: Path) -> None:  # noqa: F811
    from rlopt.compile import compile_agent

    zip_path, _, _ = agent_files(agents_dir, "ppo")
    old = compile_agent(zip_path, tmp_path / "old", backends=BACKENDS).model_dir
    (tmp_path / "w.pt").write_bytes(b"")
    with pytest.raises(UsageError, match="compiled from an SB3 agent zip"):
        rlopt.refit(old, tmp_path / "w.pt")
