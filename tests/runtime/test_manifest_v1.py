"""A MODEL_DIR written by rlopt 0.5 (manifest schema_version 1, tests/data/model_dirs/tiny-v1) loads, runs and
verifies with this rlopt."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.manifest import read_manifest
from rlopt.reference import Reference
from rlopt.verify import verify_model_dir

V1_DIR = Path(__file__).resolve().parents[1] / "data" / "model_dirs" / "tiny-v1"


def test_the_fixture_is_a_version_1_manifest_written_by_rlopt_0_5() -> None:
    import json

    document = json.loads((V1_DIR / "manifest.json").read_text())
    assert (document["schema_version"], document["rlopt_version"]) == (1, "0.5.0")


@pytest.mark.parametrize("network", ["policy", "value"])
@pytest.mark.parametrize("backend", ["auto", "torchscript", "onnxruntime"])
def test_a_version_1_model_dir_loads_and_matches_its_reference(network: str, backend: str) -> None:
    record = read_manifest(V1_DIR).networks[network]
    reference = Reference.load(V1_DIR / record.reference.path, list(record.inputs), record.outputs)
    session = rlopt.load(V1_DIR, network, backend)
    try:
        for point in reference.points:
            out = session.run(reference.feeds(point, 0))
            for name in record.outputs:
                expected = reference.arrays[f"{point}:out:{name}"][0]
                np.testing.assert_allclose(out[name], expected, atol=1e-4, rtol=1e-3)
    finally:
        session.close()


def test_a_version_1_model_dir_verifies() -> None:
    report = verify_model_dir(V1_DIR)
    assert report.passed, [f.detail for f in report.findings if not f.ok]
    checked = {(f.network, f.subject) for f in report.findings}
    assert {("policy", "onnxruntime"), ("value", "torchscript"), ("value", "tvm")} <= checked
