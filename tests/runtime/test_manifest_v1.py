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


def test_a_version_1_manifest_is_converted_in_memory_and_says_so() -> None:
    import json

    manifest = read_manifest(V1_DIR)
    assert manifest.schema_version == 2 and manifest.converted[0].startswith("schema_version 1 (written by rlopt 0.5.0)")
    document = json.loads((V1_DIR / "manifest.json").read_text())
    for name, network in manifest.networks.items():
        old = document["networks"][name]["facts"]
        assert network.facts.route is not None and network.facts.route.routes == old["auto_routes"]
        assert network.facts.route.choice is not None and network.facts.route.choice.reason == old["auto_choice"]["reason"]
        assert network.facts.profiles == old["tensorrt_plan"]["profiles"], "TensorRT's plan held the profiles"
        assert set(network.facts.route.options) <= network.facts.route.backends
    assert manifest.content_sha256 == document["content_sha256"], "the hash of manifest.json as written"


def _v1_copy(tmp_path: Path, edit) -> Path:  # type: ignore[no-untyped-def]
    """A copy of the fixture whose manifest.json `edit` changed and sealed again the way rlopt 0.5 sealed it."""
    import json
    import shutil

    from rlopt.manifest_v1 import ManifestV1

    folder = tmp_path / "v1"
    shutil.copytree(V1_DIR, folder)
    document = json.loads((folder / "manifest.json").read_text())
    edit(document)
    old = ManifestV1.model_validate(document)
    document["content_sha256"] = old.compute_content_sha256()
    (folder / "manifest.json").write_text(json.dumps(document))
    return folder


def test_a_version_1_fact_this_rlopt_does_not_declare_is_dropped_with_a_note(tmp_path: Path) -> None:
    folder = _v1_copy(tmp_path, lambda d: d["networks"]["policy"]["artifacts"]["tvm"]["facts"].update(retired=1))
    manifest = read_manifest(folder)
    assert "networks.policy.artifacts.tvm.facts.retired: not a fact this rlopt declares; dropped" in manifest.converted
    assert "retired" not in manifest.networks["policy"].artifacts["tvm"].facts.as_dict()


def test_a_modified_version_1_manifest_is_refused(tmp_path: Path) -> None:
    import json

    from rlopt.errors import ArtifactError

    folder = _v1_copy(tmp_path, lambda d: None)
    document = json.loads((folder / "manifest.json").read_text())
    document["networks"]["policy"]["selected"] = "onnxruntime"
    (folder / "manifest.json").write_text(json.dumps(document))
    with pytest.raises(ArtifactError, match="content_sha256: manifest.json was modified after it was written"):
        read_manifest(folder)
