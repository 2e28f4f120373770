"""Typed facts: the manifest stores what compile wrote as typed models, reads it back unchanged, and refuses a
misspelled or wrong-typed fact in one located line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import ValidationError

from rlopt.backends import BACKENDS, facts_of, unavailable_reason
from rlopt.backends.onnxruntime.facts import OnnxRuntimeFacts
from rlopt.backends.tvm.facts import TvmFacts
from rlopt.errors import ArtifactError
from rlopt.facts import NetworkFacts, RoutePlan
from rlopt.manifest import Manifest, read_manifest, write_json


def test_every_compiled_fact_reads_back_typed_and_unchanged(tiny_compiled: Path) -> None:
    document = json.loads((tiny_compiled / "manifest.json").read_text())
    manifest = read_manifest(tiny_compiled)
    for name, network in document["networks"].items():
        record = manifest.networks[name]
        assert isinstance(record.facts, NetworkFacts) and record.facts.as_dict() == network["facts"]
        for backend, artifact in network["artifacts"].items():
            typed = record.artifacts[backend].facts
            assert isinstance(typed, BACKENDS[backend].facts), backend
            assert typed.as_dict() == artifact["facts"], backend
    assert manifest.model_dump(mode="json") == document, "written and read back: the same JSON"
    policy = manifest.networks["policy"]
    tvm = policy.artifacts["tvm"].facts
    assert isinstance(tvm, TvmFacts) and tvm.on_cpu and tvm.shape_builds and tvm.gate_passed("padded")
    assert [f.path for f in tvm.companion_files()] == [
        *(b["file"]["path"] for b in document["networks"]["policy"]["artifacts"]["tvm"]["facts"]["shape_builds"]),
        document["networks"]["policy"]["artifacts"]["tvm"]["facts"]["params"]["file"]["path"]]
    assert isinstance(policy.facts.route, RoutePlan) and policy.facts.route.routes["other"] in policy.artifacts
    assert policy.facts.profiles[0]["input0"]["max"] == [4, 6, 32]


def test_a_misspelled_fact_fails_where_it_is_written() -> None:
    with pytest.raises(ValidationError, match="num_thread"):
        TvmFacts(num_thread=2)  # type: ignore[call-arg]
    with pytest.raises(ValidationError, match="intra_op_thread"):
        OnnxRuntimeFacts().updated(intra_op_thread=1)
    with pytest.raises(ValidationError, match="auto_routes"):
        NetworkFacts.model_validate({"auto_routes": {"other": "tvm"}})
    assert OnnxRuntimeFacts.of({"providers": ["CPUExecutionProvider"]}).as_dict() == {
        "providers": ["CPUExecutionProvider"]}, "only the keys that were set"
    facts = OnnxRuntimeFacts()
    assert OnnxRuntimeFacts.of(facts) is facts and facts.session_providers == ["CPUExecutionProvider"]


def test_availability_rules_take_dicts_or_typed_facts() -> None:
    assert unavailable_reason("onnxruntime", {}) is None
    assert unavailable_reason("onnxruntime", OnnxRuntimeFacts()) is None
    assert unavailable_reason("nosuch", {}) == "no runtime for 'nosuch' on this machine"
    assert isinstance(facts_of("tvm", {"num_threads": 2}), TvmFacts)


def _rewrite(model_dir: Path, edit) -> None:  # type: ignore[no-untyped-def]
    """Edit manifest.json's JSON, keep it sealed (so only the facts check can refuse it)."""
    document = json.loads((model_dir / "manifest.json").read_text())
    edit(document)
    body = {k: v for k, v in document.items() if k != "content_sha256"}
    import hashlib

    document["content_sha256"] = hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()
    write_json(model_dir / "manifest.json", document)


def test_a_fact_of_the_wrong_type_is_refused_in_one_located_line(tiny_copy: Path) -> None:
    _rewrite(tiny_copy, lambda d: d["networks"]["policy"]["artifacts"]["tvm"]["facts"].update(num_threads="many"))
    with pytest.raises(ArtifactError, match=r"networks\.policy\.artifacts\.tvm\.facts\.num_threads: .*integer.*; "
                                            r"fix: recompile MODEL_DIR"):
        read_manifest(tiny_copy)


def test_a_misspelled_fact_in_a_manifest_is_refused_in_one_located_line(tiny_copy: Path) -> None:
    _rewrite(tiny_copy, lambda d: d["networks"]["value"]["artifacts"]["onnxruntime"]["facts"].update(providrs=[]))
    with pytest.raises(ArtifactError, match=r"networks\.value\.artifacts\.onnxruntime\.facts\.providrs: Extra inputs"):
        read_manifest(tiny_copy)


def test_a_route_option_is_checked_against_its_backends_facts(tiny_copy: Path) -> None:
    def edit(document: dict) -> None:
        document["networks"]["policy"]["facts"]["route"]["options"] = {"onnxruntime": {"intra_op_thread": 1}}

    _rewrite(tiny_copy, edit)
    with pytest.raises(ArtifactError, match=r"networks\.policy\.facts\.route\.options\.onnxruntime\.intra_op_thread"):
        read_manifest(tiny_copy)


def test_a_manifest_written_through_the_model_is_sealed_over_what_it_holds(tiny_copy: Path) -> None:
    manifest = read_manifest(tiny_copy)
    write_json(tiny_copy / "manifest.json", Manifest.model_validate(manifest.model_dump(mode="json")).seal()
               .model_dump(mode="json"))
    assert read_manifest(tiny_copy).content_sha256 == manifest.content_sha256


@pytest.mark.parametrize("value", [True, 3, "facts", [1, 2]])
def test_facts_that_are_not_an_object_are_refused_by_validation_not_a_type_error(value: object) -> None:
    """A manifest's `facts: true` is a validation error (read_manifest turns it into one line, exit 2)."""
    with pytest.raises(ValidationError):
        facts_of("onnxruntime", value)
