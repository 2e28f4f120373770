"""The runtime loads exactly the `auto` configuration compile measured and recorded; compile records why."""

from __future__ import annotations

import json
from types import SimpleNamespace
from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.compile.measure import ORT_ONE_THREAD, measure_configurations, named_shapes
from rlopt.facts import NetworkFacts
from rlopt.manifest import Manifest, read_manifest, write_json
from rlopt.tools.bench.candidates import load_reference

SPIN_KEY = "session.intra_op.allow_spinning"


def _ort_options(session: rlopt.Session):
    return session._gen.runners["onnxruntime"]._session.get_session_options()


def _ort_spins(session: rlopt.Session) -> bool:
    options = _ort_options(session)
    try:
        return options.get_session_config_entry(SPIN_KEY) != "0"
    except RuntimeError:  # not set: ONNX Runtime's default, spinning
        return True


def _record_route(model_dir: Path, routes: dict[str, str], spinning: bool, threads: int | None = None,
                  shape_threads: dict[str, int] | None = None) -> None:
    document = json.loads((model_dir / "manifest.json").read_text())
    facts = document["networks"]["policy"]["facts"]
    facts.update(auto_routes=routes, auto_onnxruntime_spinning=spinning)
    facts.pop("auto_onnxruntime_threads", None)
    facts.pop("auto_onnxruntime_shape_threads", None)
    if threads:
        facts["auto_onnxruntime_threads"] = threads
    if shape_threads:
        facts["auto_onnxruntime_shape_threads"] = shape_threads
    write_json(model_dir / "manifest.json", Manifest.model_validate(document).seal().model_dump(mode="json"))


def test_compile_records_what_it_chose_and_why(tiny_compiled: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    facts = NetworkFacts.of(record.facts)
    choice = facts.auto_choice
    assert choice is not None and choice.reason
    shapes = {"1x1x32", "2x3x32", "4x6x32", "other"}
    tables = [choice.alone_us, choice.together_us] if choice.rounds else [choice.alone_us]
    for table in tables:
        assert table and all(set(latency) == shapes and min(latency.values()) > 0 for latency in table.values())
    if not choice.rounds:
        assert not choice.together_us
    assert choice.mixed == (len(set(facts.auto_routes.values())) > 1)
    assert facts.auto_onnxruntime_spinning is (not choice.mixed)
    assert record.selected == facts.auto_routes["2x3x32"], "selected: what auto runs at opt"


def test_every_candidate_is_timed_alone_and_together_at_every_shape(tiny_compiled: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    ctx = SimpleNamespace(staging=tiny_compiled, reference=load_reference(tiny_compiled, record))
    labels = named_shapes(record, ctx.reference) | {"other": "opt"}
    alone, together, rounds = measure_configurations(ctx, record, ["onnxruntime", "tvm"], labels,  # type: ignore[arg-type]
                                                     one_thread_ort=True)
    assert rounds >= 1
    for table in (alone, together):
        assert set(table) == {"onnxruntime", "tvm", ORT_ONE_THREAD}
        assert all(set(t) == set(labels) and 0 < min(t.values()) < 1e6 for t in table.values())
    assert set(labels) == {"1x1x32", "2x3x32", "4x6x32", "other"}


def test_a_mixed_route_runs_ort_without_spinning_and_a_single_one_with(tiny_copy: Path) -> None:
    _record_route(tiny_copy, {"1x1x32": "tvm", "2x3x32": "onnxruntime", "4x6x32": "onnxruntime",
                              "other": "onnxruntime"}, spinning=False)
    mixed = rlopt.load(tiny_copy, "policy")
    assert mixed.routes["1x1x32"] == "tvm" and mixed.routes["other"] == "onnxruntime"
    assert not _ort_spins(mixed)
    everywhere = dict.fromkeys(["1x1x32", "2x3x32", "4x6x32", "other"], "onnxruntime")
    _record_route(tiny_copy, everywhere, spinning=True)
    single = rlopt.load(tiny_copy, "policy")
    assert set(single.routes.values()) == {"onnxruntime"} and set(single._gen.runners) == {"onnxruntime"}
    assert _ort_spins(single)
    default_threads = _ort_options(single).intra_op_num_threads
    _record_route(tiny_copy, everywhere, spinning=True, threads=1)
    assert _ort_options(rlopt.load(tiny_copy, "policy")).intra_op_num_threads == 1
    assert _ort_options(rlopt.load(tiny_copy, "policy", backend="onnxruntime")).intra_op_num_threads == default_threads
    assert _ort_spins(rlopt.load(tiny_copy, "policy", backend="onnxruntime"))


def test_auto_runs_the_shapes_compile_gave_other_threads_on_a_session_with_those_threads(tiny_copy: Path) -> None:
    everywhere = dict.fromkeys(["1x1x32", "2x3x32", "4x6x32", "other"], "onnxruntime")
    _record_route(tiny_copy, everywhere, spinning=True, threads=1, shape_threads={"4x6x32": 0})
    session = rlopt.load(tiny_copy, "policy")
    runner = session._gen.runners["onnxruntime"]
    assert runner._session.get_session_options().intra_op_num_threads == 1
    assert set(runner._by_shape) == {"4x6x32"}
    assert runner._by_shape["4x6x32"].get_session_options().intra_op_num_threads == 0
    with rlopt.load(tiny_copy, "policy", backend="onnxruntime") as named:
        reference = load_reference(tiny_copy, read_manifest(tiny_copy).networks["policy"])
        feeds = reference.feeds("max", 0)
        for _ in range(3):  # checked, then the bound call
            assert all(np.array_equal(session.run(feeds)[k], v) for k, v in named.run(feeds).items())
        assert not named._gen.runners["onnxruntime"]._by_shape, "a named backend runs as built"
    session.close()


def test_auto_serves_onnx_runtime_from_both_thread_configurations_and_a_named_backend_from_one(
        tiny_copy: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.machine import usable_cores

    everywhere = dict.fromkeys(["1x1x32", "2x3x32", "4x6x32", "other"], "onnxruntime")
    _record_route(tiny_copy, everywhere, spinning=True, threads=1)
    monkeypatch.delenv("RLOPT_ORT_ADAPTIVE", raising=False)
    assert not rlopt.load(tiny_copy, "policy")._gen.runners["onnxruntime"]._sessions, "opt-in"
    monkeypatch.setenv("RLOPT_ORT_ADAPTIVE", "1")
    sessions = rlopt.load(tiny_copy, "policy")._gen.runners["onnxruntime"]._sessions
    assert list(sessions) == (["1 thread", "default pool"] if usable_cores() > 1 else [])
    assert not rlopt.load(tiny_copy, "policy", backend="onnxruntime")._gen.runners["onnxruntime"]._sessions
