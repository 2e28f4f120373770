"""The three bundled recipes: each loads, builds, scripts and ships a tuning database that matches it (default
suite, seconds); each compiles, verifies at min/opt/max and loads in a fresh process on every CPU backend (slow:
about a minute a recipe on two cores).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from importlib.util import find_spec
from pathlib import Path

import numpy as np
import pytest

from rlopt.manifest import read_manifest
from tests.conftest import RECIPES, assert_tensorrt_as_this_machine_allows, run_rlopt

BUNDLED = ["policy_value_heads.yaml", "ppo_mlp.yaml", "atari_cnn.yaml"]

# recipe -> its name, then network -> output -> shape at the max profile point
EXPECTED = {
    "policy_value_heads.yaml": ("policy-value-heads", {"policy": {"logits": (8, 16, 16)},
                                                        "value": {"value": (8, 16, 1)}}),
    "ppo_mlp.yaml": ("ppo-mlp", {"actor": {"mean": (256, 6), "log_std": (256, 6)}, "critic": {"value": (256, 1)}}),
    "atari_cnn.yaml": ("atari-cnn", {"actor_critic": {"logits": (16, 6), "value": (16, 1)}}),
}
TUNED_TARGETS = ["llvm-znver5"]


def test_every_bundled_recipe_is_listed() -> None:
    assert sorted(p.name for p in RECIPES.glob("*.yaml")) == sorted(BUNDLED) == sorted(EXPECTED)


@pytest.mark.parametrize("recipe", BUNDLED)
def test_bundled_recipe_loads_builds_and_scripts(recipe: str, tmp_path: Path) -> None:
    """The recipe validates, its factory builds, each network runs eagerly at min/opt/max with the declared
    outputs, and its TorchScript agrees with eager PyTorch (the compile's first stages, without the backends)."""
    import torch

    from rlopt.recipe import load_recipe
    from rlopt.reference import record_reference
    from rlopt.user_model import build_model, submodule
    from rlopt.stages.script import script_network

    path = RECIPES / recipe
    loaded = load_recipe(path)
    name, outputs = EXPECTED[recipe]
    assert loaded.name == name
    assert {n: spec.outputs for n, spec in loaded.networks.items()} == {n: list(o) for n, o in outputs.items()}
    extra = ["openvino"] if recipe == "policy_value_heads.yaml" else []  # the demo shows the optional backend
    assert loaded.backends == ["torchscript", "onnxruntime", "tvm", "tensorrt", *extra]
    model, built = build_model(loaded.model, path)
    assert built["parameters"] == sum(p.numel() for p in model.parameters()) > 0
    for network, spec in loaded.networks.items():
        module = submodule(model, spec.module, path, network)
        reference = record_reference(module, spec, 1, 0, recipe_path=path, network=network)
        assert reference.points == ["min", "opt", "max"]
        for output, shape in outputs[network].items():
            assert reference.arrays[f"max:out:{output}"].shape == (1, *shape)
            assert np.isfinite(reference.arrays[f"max:out:{output}"]).all()
        script_network(module, tmp_path / f"{network}.ts", recipe_path=path, network=network, module_path=spec.module)
        scripted = torch.jit.load(str(tmp_path / f"{network}.ts"))
        for point in reference.points:
            feeds = reference.feeds(point, 0)
            with torch.inference_mode():
                result = scripted(*[torch.from_numpy(feeds[n]) for n in spec.inputs])
            result = result if isinstance(result, tuple) else (result,)
            for got, want in zip(result, reference.outputs(point, 0), strict=True):
                np.testing.assert_allclose(got.detach().numpy(), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("recipe", BUNDLED)
def test_bundled_tuning_database_is_readable_and_matches_the_recipe(recipe: str) -> None:
    """The shipped `<recipe>.tuning/` has one workload per network and profile shape, each kernel's best
    record, and opens as a MetaSchedule database (what compile applies when the CPU matches)."""
    from rlopt.backends.tvm.database import file_slug, open_database, profile_shapes, read_meta, shape_key, target_key
    from rlopt.recipe import load_recipe

    path = RECIPES / recipe
    loaded = load_recipe(path)
    root = path.with_suffix(".tuning")
    assert sorted(d.name for d in root.iterdir()) == TUNED_TARGETS
    for directory in root.iterdir():
        meta = read_meta(directory)
        assert target_key(meta["target"]) == directory.name
        expected = {f"{network}[{shape_key(shapes)}]": (points, file_slug(shapes))
                    for network, spec in loaded.networks.items() for points, shapes in profile_shapes(spec)}
        assert set(meta["workloads"]) == set(expected)
        tasks: set[str] = set()
        for key, workload in meta["workloads"].items():
            points, slug = expected[key]
            assert workload["points"] == points
            assert workload["trials"] >= 64
            assert workload["tasks"] and all(task.split("/")[1] == slug for task in workload["tasks"])
            tasks.update(workload["tasks"])
        database = open_database(directory, create=False)
        assert database is not None
        records = database.get_all_tuning_records()
        assert len(records) == len(tasks), "pruned: one best record per distinct kernel"
        for record in records:
            seconds = [float(s) for s in record.run_secs]
            assert seconds and all(math.isfinite(s) and 0 < s < 1 for s in seconds)

FRESH_LOAD = """\
import json, sys
import numpy as np
import rlopt
from rlopt.manifest import read_manifest
model_dir = sys.argv[1]
results = {}
for network, record in read_manifest(model_dir).networks.items():
    for backend in ("torchscript", "onnxruntime", "tvm"):
        session = rlopt.load(model_dir, network, backend=backend)
        feeds = {}
        for name, profile in record.inputs.items():
            dtype = np.dtype(profile.dtype)
            shape = profile.min
            feeds[name] = (np.full(shape, 7, dtype) if dtype.kind in "iub" else np.full(shape, 0.25, dtype))
        outputs = session.run(feeds)
        results[f"{network}/{backend}"] = {k: float(np.asarray(v, np.float64).sum()) for k, v in outputs.items()}
print(json.dumps(results))
"""


@pytest.mark.slow
@pytest.mark.parametrize("recipe", BUNDLED)
def test_bundled_recipe_compiles_verifies_and_loads_fresh(recipe: str, tmp_path: Path) -> None:
    out = tmp_path / "model_dir"
    proc = run_rlopt("compile", str(RECIPES / recipe), "-o", str(out), "--json", timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    manifest = read_manifest(out)
    for network in manifest.networks.values():
        for backend in ("torchscript", "onnxruntime", "tvm"):
            record = network.artifacts[backend]
            assert record.verified, (backend, record)
            assert len(record.parity.shapes) == 3, "min, opt and max all checked"
        assert_tensorrt_as_this_machine_allows(network.artifacts["tensorrt"])
        openvino = network.artifacts.get("openvino")
        if openvino is not None:  # verified where the extra is installed, else skipped saying how to install it
            assert openvino.verified if find_spec("openvino") else "rlopt[openvino]" in (openvino.skipped or "")
    verify = run_rlopt("verify", str(out), "--json")
    assert verify.returncode == 0 and json.loads(verify.stdout)["passed"]
    fresh = subprocess.run([sys.executable, "-c", FRESH_LOAD, str(out)], capture_output=True, text=True, timeout=300)
    assert fresh.returncode == 0, fresh.stderr[-3000:]
    sums = json.loads(fresh.stdout)
    for network in manifest.networks:
        per_backend = [sums[f"{network}/{b}"] for b in ("torchscript", "onnxruntime", "tvm")]
        for output in per_backend[0]:
            values = [s[output] for s in per_backend]
            assert max(values) - min(values) <= 1e-3 * max(1.0, abs(values[0])), (network, output, values)
