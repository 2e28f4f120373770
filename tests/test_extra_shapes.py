"""Extra exact shapes (`networks.<n>.shapes`, a recipe's `warmup_profile`): recorded, verified, timed, tuned, routed."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.errors import RecipeError
from rlopt.manifest import read_manifest
from rlopt.recipe import load_recipe
from rlopt.verify import verify_model_dir
from tests.conftest import CompileFactory, assert_one_line_error, run_rlopt, write_tiny_recipe

PROFILE = {"network": "policy", "requests": [{"weight": 0.5, "shapes": {"input0": [3, 2, 32]}},
                                             {"weight": 0.5, "shapes": {"input0": [2, 3, 32]}}]}


def _recipe(folder: Path, profile: dict | None = PROFILE, shapes: str = "[2, 2, 32]") -> Path:
    path = write_tiny_recipe(folder, backends="[torchscript, onnxruntime, tvm]")
    text = path.read_text().replace("    outputs: [logits]\n",
                                    f"    outputs: [logits]\n    shapes:\n      - {{input0: {shapes}}}\n", 1)
    if profile is not None:
        (folder / "profile.json").write_text(json.dumps(profile))
        text += "warmup_profile: profile.json\n"
    path.write_text(text)
    return path


def test_points_are_profile_then_extra_shapes_each_once(tmp_path: Path) -> None:
    spec = load_recipe(_recipe(tmp_path)).networks["policy"]
    assert list(spec.points()) == ["min", "opt", "max", "2x2x32", "3x2x32"], "[2,3,32] is opt: listed once"
    assert load_recipe(_recipe(tmp_path, None)).networks["value"].shapes == []


@pytest.mark.parametrize(("profile", "shapes", "needles"), [
    (None, "[5, 2, 32]", ["tiny.yaml", "networks.policy.shapes", "outside the profile", "[4, 6, 32]"]),
    ({"network": "critic", "requests": [{"weight": 1, "shapes": {"input0": [2, 2, 32]}}]}, "[2, 2, 32]",
     ["profile.json", "network", "'critic'", "policy"]),
    ({"network": "policy", "requests": [{"weight": 1, "shapes": {"input0": [2, 2, 32]}},
                                        {"weight": 1, "shapes": {"input0": [1, 9, 32]}}]}, "[2, 2, 32]",
     ["profile.json", "requests[1].shapes", "[1, 9, 32]", "outside"]),
    ({"network": "policy", "requests": [{"weight": 1, "shapes": {"obs": [2, 2, 32]}}]}, "[2, 2, 32]",
     ["profile.json", "requests[0].shapes", "input0"]),
])
def test_bad_extra_shapes_are_one_located_line(tmp_path: Path, profile: dict | None, shapes: str,
                                               needles: list[str]) -> None:
    with pytest.raises(RecipeError) as info:
        load_recipe(_recipe(tmp_path, profile, shapes))
    message = str(info.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, (needle, message)


def test_missing_warmup_profile_is_one_line_with_exit_2(tmp_path: Path) -> None:
    path = _recipe(tmp_path)
    (tmp_path / "profile.json").unlink()
    result = run_rlopt("compile", str(path), "-o", str(tmp_path / "out"))
    assert_one_line_error(result, 2, "tiny.yaml", "warmup_profile", "not found")


@pytest.fixture(scope="module")
def extra_compiled(compiled: CompileFactory, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny recipe with an extra shape and a warmup profile, compiled once per session; read-only."""
    return compiled(_recipe(tmp_path_factory.mktemp("extra")))


def test_extra_shapes_are_verified_timed_built_and_routed(extra_compiled: Path) -> None:
    record = read_manifest(extra_compiled).networks["policy"]
    tvm = record.artifacts["tvm"]
    assert [s.split()[0] for s in tvm.parity.shapes] == ["min", "opt", "max", "2x2x32", "3x2x32"]
    assert tvm.parity.passed and tvm.facts.gate_passed("dynamic")
    for backend in ("torchscript", "onnxruntime", "tvm"):
        assert set(record.artifacts[backend].latency_us) == {"min", "opt", "max", "2x2x32", "3x2x32"}
    built = {"x".join(map(str, b.shapes["input0"])): b.points for b in tvm.facts.shape_builds}
    assert built == {"1x1x32": ["min"], "2x3x32": ["opt"], "4x6x32": ["max"], "2x2x32": ["2x2x32"],
                     "3x2x32": ["3x2x32"]}
    assert record.facts.route is not None and set(record.facts.route.routes) == {"1x1x32", "2x3x32", "4x6x32", "2x2x32", "3x2x32", "other"}
    assert "3x2x32" not in {"x".join(map(str, b.shapes["input0"])) for b in
                            read_manifest(extra_compiled).networks["value"].artifacts["tvm"].facts.shape_builds}


def test_extra_shape_runs_its_own_library_and_matches_torch(extra_compiled: Path) -> None:
    session = rlopt.load(extra_compiled, "policy", backend="tvm")
    runner = session._gen.runners["tvm"]
    assert ((3, 2, 32),) in runner.shape_buckets and ((2, 2, 32),) in runner.shape_buckets
    reference = rlopt.load(extra_compiled, "policy", backend="torchscript")
    x = np.random.default_rng(4).standard_normal((3, 2, 32)).astype(np.float32)
    np.testing.assert_allclose(session.run({"input0": x})["logits"], reference.run({"input0": x})["logits"],
                               atol=1e-5, rtol=1e-4)
    report = verify_model_dir(extra_compiled)
    assert report.passed, [f.detail for f in report.findings if not f.ok]
    [parity] = [f.parity for f in report.findings if (f.network, f.subject) == ("policy", "tvm")]
    assert parity is not None and [s.split()[0] for s in parity.shapes] == ["min", "opt", "max", "2x2x32", "3x2x32"]
    assert parity.compared == 5 * 4, "every point re-checked, 4 samples each"
