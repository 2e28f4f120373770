"""manifest.json's schema_version (contract section 7): an older or newer layout is refused in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlopt import manifest
from rlopt.errors import ArtifactError
from rlopt.manifest import read_manifest
from tests.conftest import assert_one_line_error, run_rlopt


def _model_dir(folder: Path, **document: object) -> Path:
    """A MODEL_DIR whose manifest.json holds only `document`: the version is checked before anything else."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "manifest.json").write_text(json.dumps(document))
    return folder


def test_an_older_layout_is_refused_naming_the_command_that_rebuilds_it(tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(manifest, "SCHEMA_VERSION", manifest.SCHEMA_VERSION + 1)
    old = _model_dir(tmp_path / "old", schema_version=manifest.SCHEMA_VERSION - 1, rlopt_version="0.5.0")
    with pytest.raises(ArtifactError) as caught:
        read_manifest(old)
    line = str(caught.value)
    assert line == (f"{old / 'manifest.json'}: schema_version: {manifest.SCHEMA_VERSION - 1} was written by rlopt "
                    f"0.5.0 and this rlopt reads {manifest.SCHEMA_VERSION}; fix: rlopt compile RECIPE -o {old}")


def test_a_newer_layout_is_refused_saying_to_upgrade(tmp_path: Path) -> None:
    newer = _model_dir(tmp_path / "newer", schema_version=manifest.SCHEMA_VERSION + 1, rlopt_version="9.0.0")
    with pytest.raises(ArtifactError, match=rf"schema_version: {manifest.SCHEMA_VERSION + 1} was written by rlopt "
                                            rf"9.0.0, newer than this rlopt, which reads {manifest.SCHEMA_VERSION}; "
                                            r"fix: upgrade rlopt"):
        read_manifest(newer)


@pytest.mark.parametrize("version", [0, -1, "1", True, None, 1.0])
def test_a_value_that_is_no_schema_version_is_refused(tmp_path: Path, version: object) -> None:
    folder = _model_dir(tmp_path / "bad", schema_version=version)
    with pytest.raises(ArtifactError, match=r"schema_version: .* is not a schema version"):
        read_manifest(folder)


def test_the_cli_refuses_a_newer_model_dir_with_exit_2_and_one_line(tmp_path: Path) -> None:
    newer = _model_dir(tmp_path / "newer", schema_version=manifest.SCHEMA_VERSION + 1, rlopt_version="9.0.0")
    assert_one_line_error(run_rlopt("verify", str(newer)), 2, "schema_version", "newer than this rlopt",
                          "fix: upgrade rlopt")


def test_the_json_schema_describes_facts_by_their_typed_models() -> None:
    schema = manifest.manifest_json_schema()
    json.dumps(schema)  # serializable as is
    assert schema["title"] == "Manifest" and "networks" in schema["properties"]
    definitions = schema["$defs"]
    for model in ("NetworkFacts", "TvmFacts", "OnnxRuntimeFacts", "TensorRTFacts", "TorchScriptFacts", "ShapeBuild"):
        assert model in definitions, model
    assert definitions["NetworkRecord"]["properties"]["facts"]["$ref"] == "#/$defs/NetworkFacts"
    refs = {ref["$ref"] for ref in definitions["BackendRecord"]["properties"]["facts"]["anyOf"]}
    assert "#/$defs/TvmFacts" in refs and "#/$defs/OnnxRuntimeFacts" in refs
    assert definitions["TvmFacts"]["additionalProperties"] is False, "a fact not declared is refused"
    assert definitions["NetworkFacts"]["additionalProperties"] is False
    assert definitions["RoutePlan"]["properties"]["options"]["type"] == "object"
