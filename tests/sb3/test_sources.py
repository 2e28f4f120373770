"""What compile stores for an agent: MODEL_DIR/recipe.yaml paths relative to it, and the rollout's share of
reference.npz capped in bytes, subsampled evenly (contract section 9)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from rlopt.compile.sources import stored_recipe  # noqa: E402
from rlopt.recipe import load_recipe  # noqa: E402
from rlopt.reference import Reference, add_rollout_point, evenly_spaced  # noqa: E402

RECIPE = """name: agent
model: {{sb3: {zip}, vecnormalize: {pkl}}}
networks:
  actor:
    module: actor
    inputs:
      obs: {{dtype: float32, min: [1, 4], opt: [1, 4], max: [1, 4]}}
    outputs: [action]
"""


@pytest.mark.parametrize("given", ["absolute", "relative"])
def test_stored_recipe_paths_are_relative_to_the_model_dir(given: str, tmp_path: Path) -> None:
    agents = tmp_path / "agents"
    agents.mkdir()
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    zip_path, pkl = (agents / "ppo.zip", agents / "stats.pkl") if given == "absolute" else \
        ("../agents/ppo.zip", "../agents/stats.pkl")
    (recipes / "r.yaml").write_text(RECIPE.format(zip=zip_path, pkl=pkl))
    recipe = load_recipe(recipes / "r.yaml")
    stored = stored_recipe(recipe, recipes / "r.yaml", tmp_path / "artifacts" / "ppo")
    assert (stored.model.sb3, stored.model.vecnormalize) == ("../../agents/ppo.zip", "../../agents/stats.pkl")
    assert stored.networks == recipe.networks and "/tmp" not in stored.resolved_yaml()


class Double(torch.nn.Module):
    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return obs.to(torch.float32) * 2.0


def test_rollout_samples_capped_in_bytes_evenly(monkeypatch: pytest.MonkeyPatch) -> None:
    import rlopt.reference

    visited = 64
    feeds = {"obs": np.arange(visited * 48, dtype=np.uint8).reshape(visited, 1, 4, 4, 3)}
    random = {"min:in:obs": np.zeros((4, 1, 4, 4, 3), np.uint8), "min:out:action": np.zeros((4, 1, 4, 4, 3),
                                                                                            np.float32)}
    sample = 48 + 48 * 4   # one visited input (uint8) and its output (float32)
    used = sum(v.nbytes for v in random.values())
    monkeypatch.setattr(rlopt.reference, "REFERENCE_BYTES", used + 10 * sample + 5)
    reference = Reference(dict(random), ["obs"], ["action"])
    add_rollout_point(reference, Double(), feeds)
    kept = reference.arrays["rollout:in:obs"]
    assert kept.shape == (10, 1, 4, 4, 3)
    index = evenly_spaced(visited, 10)
    assert index[0] == 0 and index[-1] == visited - 1
    np.testing.assert_array_equal(kept, feeds["obs"][index])
    np.testing.assert_array_equal(reference.arrays["rollout:out:action"], feeds["obs"][index].astype(np.float32) * 2)
    assert sum(v.nbytes for v in reference.arrays.values()) <= rlopt.reference.REFERENCE_BYTES

    full = Reference(dict(random), ["obs"], ["action"])   # no room at all: no rollout point, never over the cap
    monkeypatch.setattr(rlopt.reference, "REFERENCE_BYTES", used)
    add_rollout_point(full, Double(), feeds)
    assert "rollout:in:obs" not in full.arrays and full.points == ["min"]
