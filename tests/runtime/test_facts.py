"""Typed facts: they read what compile writes without changing it, and a wrong-typed fact is one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlopt.backends import facts_of, unavailable_reason
from rlopt.backends.onnxruntime.facts import OnnxRuntimeFacts
from rlopt.backends.tvm.facts import TvmFacts
from rlopt.errors import ArtifactError
from rlopt.facts import NetworkFacts
from rlopt.manifest import Manifest, read_manifest, write_json


def test_every_compiled_fact_reads_back_typed_and_unchanged(tiny_compiled: Path) -> None:
    document = json.loads((tiny_compiled / "manifest.json").read_text())
    for network in document["networks"].values():
        assert NetworkFacts.of(network["facts"]).as_dict() == network["facts"]
        for backend, artifact in network["artifacts"].items():
            typed = facts_of(backend, artifact.get("facts", {}))
            assert typed.as_dict() == artifact.get("facts", {}), backend
    policy = read_manifest(tiny_compiled).networks["policy"]
    tvm = facts_of("tvm", policy.artifacts["tvm"].facts)
    assert isinstance(tvm, TvmFacts) and tvm.on_cpu and tvm.shape_builds and tvm.gate_passed("padded")
    assert [f.path for f in tvm.companion_files()] == [
        *(b["file"]["path"] for b in policy.artifacts["tvm"].facts["shape_builds"]),
        policy.artifacts["tvm"].facts["params"]["file"]["path"]]
    assert NetworkFacts.of(policy.facts).auto_routes["other"] in policy.artifacts


def test_facts_this_rlopt_does_not_declare_are_kept() -> None:
    facts = OnnxRuntimeFacts.of({"providers": ["CPUExecutionProvider"], "from_a_newer_build": {"x": 1}})
    assert facts.as_dict() == {"providers": ["CPUExecutionProvider"], "from_a_newer_build": {"x": 1}}
    assert OnnxRuntimeFacts.of(facts) is facts
    assert OnnxRuntimeFacts.of({}).session_providers == ["CPUExecutionProvider"]


def test_availability_rules_take_dicts_or_typed_facts() -> None:
    assert unavailable_reason("onnxruntime", {}) is None
    assert unavailable_reason("onnxruntime", OnnxRuntimeFacts()) is None
    assert unavailable_reason("nosuch", {}) == "no runtime for 'nosuch' on this machine"


def test_a_fact_of_the_wrong_type_is_refused_in_one_located_line(tiny_copy: Path) -> None:
    document = json.loads((tiny_copy / "manifest.json").read_text())
    document["networks"]["policy"]["artifacts"]["tvm"]["facts"]["num_threads"] = "many"
    write_json(tiny_copy / "manifest.json", Manifest.model_validate(document).seal().model_dump(mode="json"))
    with pytest.raises(ArtifactError, match=r"networks\.policy\.artifacts\.tvm\.facts\.num_threads: .*integer.*; "
                                            r"fix: recompile MODEL_DIR"):
        read_manifest(tiny_copy)
