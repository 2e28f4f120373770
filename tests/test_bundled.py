"""The three bundled recipes compile, verify at min/opt/max, and load in a fresh process on every CPU backend."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from rlopt.manifest import read_manifest
from tests.conftest import RECIPES, run_rlopt

BUNDLED = ["policy_value_heads.yaml", "ppo_mlp.yaml", "atari_cnn.yaml"]

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
        assert network.artifacts["tensorrt"].skipped
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
