"""rlopt.warmup_profile: validation of warmup profiles, and no import of rlopt.recipe (the cycle is gone)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from rlopt.errors import ProfileError
from rlopt.manifest import InputProfile, read_manifest
from rlopt.recipe import load_recipe
from rlopt.warmup_profile import check_against, load_profile, read_profile
from tests.conftest import RECIPES
from tests.tools.common import with_changes, write_profile

PROFILES = RECIPES / "warmup_profiles"


@pytest.mark.parametrize(("document", "field", "needle"), [
    (with_changes(network="critic"), "network", "use one of: policy, value"),
    (with_changes(requests=[{"weight": 1, "shapes": {"obs": [1, 1, 32]}}]), "requests.0.shapes.obs", "no input 'obs'"),
    (with_changes(requests=[{"weight": 1, "shapes": {"input0": [1, 7, 32]}}]), "requests.0.shapes.input0",
     "dim 1 is 7, allowed [1, 6]"),
    (with_changes(requests=[{"weight": 1, "shapes": {"input0": [1, 32]}}]), "requests.0.shapes.input0", "rank 2"),
    (with_changes(requests=[{"weight": 1, "shapes": {}}]), "requests.0.shapes", "give the shape of every input"),
    (with_changes(requests=[{"weight": 0, "shapes": {"input0": [1, 1, 32]}}]), "requests.0.weight", "greater than 0"),
    (with_changes(requests=[{"weight": -1, "shapes": {"input0": [1, 1, 32]}}]), "requests.0.weight",
     "greater than 0"),
    (with_changes(requests=[]), "requests", "at least 1 item"),
    (with_changes(slo={"p99_ms": 0}), "slo.p99_ms", "greater than 0"),
    (with_changes(concurrency=0), "concurrency", "greater than or equal to 1"),
    (with_changes(durations=5), "durations", "unknown field"),
    ("{\"network\": \"policy\",", "line 1", "invalid JSON"),
    ("[1, 2]", "(top level)", "expected a JSON object"),
])
def test_profile_errors_name_file_and_field(tiny_compiled: Path, tmp_path: Path, document: Any, field: str,
                                            needle: str) -> None:
    path = write_profile(tmp_path, document)
    with pytest.raises(ProfileError) as caught:
        load_profile(path, read_manifest(tiny_compiled), tiny_compiled)
    message = str(caught.value)
    assert message.startswith(f"{path}: {field}"), message
    assert needle in message and "fix:" in message and "\n" not in message


def test_missing_profile_file(tmp_path: Path) -> None:
    with pytest.raises(ProfileError, match="warmup profile not found; fix: check the --profile path"):
        read_profile(tmp_path / "nope.json")


@pytest.mark.parametrize(("profile", "recipe"), [("chatbot.json", "policy_value_heads.yaml"),
                                                 ("ppo_mlp.json", "ppo_mlp.yaml"),
                                                 ("atari_cnn.json", "atari_cnn.yaml")])
def test_bundled_profiles_fit_their_recipes(profile: str, recipe: str) -> None:
    """Each shipped profile names a network of its recipe and shapes inside its [min, max]."""
    spec = load_recipe(RECIPES / recipe)
    networks = {name: SimpleNamespace(inputs={i: InputProfile(dtype=s.dtype, min=s.dims("min"), opt=s.dims("opt"),
                                                              max=s.dims("max")) for i, s in net.inputs.items()})
                for name, net in spec.networks.items()}
    parsed = read_profile(PROFILES / profile)
    check_against(parsed, SimpleNamespace(networks=networks), PROFILES / profile, recipe)  # type: ignore[arg-type]
    assert len(parsed.distinct_shapes()) == 3


def test_chatbot_profile_is_the_reference_mix() -> None:
    parsed = read_profile(PROFILES / "chatbot.json")
    assert parsed.network == "policy"
    assert [r.shapes["input0"] for r in parsed.requests] == [[1, 1, 768], [4, 8, 768], [8, 16, 768]]



def test_the_profile_module_does_not_import_the_recipe_module() -> None:
    """rlopt.recipe imports the profile module (a recipe's `warmup_profile`): the reverse would be a cycle."""
    code = ("import json, sys; import rlopt.warmup_profile; "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('rlopt'))))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 0, proc.stderr
    loaded = json.loads(proc.stdout)
    assert "rlopt.recipe" not in loaded and "rlopt.tools.warmup.driver" not in loaded, loaded
