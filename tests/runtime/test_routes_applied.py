"""The runtime loads exactly the `auto` configuration compile measured and recorded; compile records why."""

from __future__ import annotations

import json
from types import SimpleNamespace
from pathlib import Path

import numpy as np

import rlopt
from rlopt.compile.auto import named_shapes
from rlopt.compile.route_passes import MIN_PASSES, measure_configurations, most_passes
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
    """A RoutePlan as compile would record it: ONNX Runtime's options (spinning off, threads) where they differ."""
    document = json.loads((model_dir / "manifest.json").read_text())
    facts = document["networks"]["policy"]["facts"]
    ort: dict[str, object] = {} if spinning else {"allow_spinning": False}
    if threads:
        ort["intra_op_threads"] = threads
    if shape_threads:
        ort["shape_threads"] = shape_threads
    facts["route"] = {**facts["route"], "routes": routes, "options": {"onnxruntime": ort} if ort else {}}
    write_json(model_dir / "manifest.json", Manifest.model_validate(document).seal().model_dump(mode="json"))


def test_compile_records_what_it_chose_and_why(tiny_compiled: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    route = record.facts.route
    assert route is not None
    choice = route.choice
    assert choice is not None and choice.reason
    shapes = {"1x1x32", "2x3x32", "4x6x32", "other"}
    tables = [choice.alone_us, choice.together_us] if choice.rounds else [choice.alone_us]
    for table in tables:
        assert table and all(set(latency) == shapes and min(latency.values()) > 0 for latency in table.values())
    if not choice.rounds:
        assert not choice.together_us
    assert choice.mixed == (len(set(route.routes.values())) > 1)
    assert "allow_spinning" not in route.options.get("onnxruntime", {}), "ORT's pool spins in every route"
    if "tvm" in route.backends:
        assert route.options["tvm"]["calling_thread_only"] is True, "TVM on its calling thread"
    assert set(route.options) <= route.backends
    assert choice.measured_at and choice.cores and len(choice.other_load_cores) == choice.passes
    least = min(MIN_PASSES, most_passes())  # the suite compiles with $RLOPT_ROUTE_PASSES=1 (tests/conftest.py)
    assert choice.passes == 0 or (choice.passes >= least and choice.stable is not None and choice.aa_noise)
    assert choice.passes != 1 or choice.stable is False, "one pass decides alone and is not called stable"
    assert record.selected == route.routes["2x3x32"], "selected: what auto runs at opt"


def test_every_candidate_is_timed_alone_and_together_at_every_shape(tiny_compiled: Path) -> None:
    record = read_manifest(tiny_compiled).networks["policy"]
    ctx = SimpleNamespace(staging=tiny_compiled, reference=load_reference(tiny_compiled, record))
    labels = named_shapes(record, ctx.reference) | {"other": "opt"}
    variants = {"onnxruntime": {"1 thread": {"intra_op_threads": 1}}}
    measured = measure_configurations(ctx, record, ["onnxruntime", "tvm"], labels,  # type: ignore[arg-type]
                                      variants=variants)
    assert measured.rounds >= 1
    assert set(measured.together) == {"onnxruntime", "tvm", "onnxruntime 1 thread"}
    assert set(measured.alone) == set(measured.cpu) == {*measured.together, "onnxruntime (A/A)"}, "ORT's twin"
    for table in (measured.alone, measured.together, measured.cpu):
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


def test_spinning_false_opens_every_onnxruntime_session_without_spinning_and_a_reload_keeps_it(
        tiny_copy: Path) -> None:
    everywhere = dict.fromkeys(["1x1x32", "2x3x32", "4x6x32", "other"], "onnxruntime")
    _record_route(tiny_copy, everywhere, spinning=True, threads=2, shape_threads={"4x6x32": 0})
    assert _ort_spins(rlopt.load(tiny_copy, "policy")), "the recorded route spins"
    with rlopt.load(tiny_copy, "policy", spinning=False) as quiet:
        runner = quiet._gen.runners["onnxruntime"]
        assert not _ort_spins(quiet)
        assert runner._by_shape["4x6x32"].get_session_options().get_session_config_entry(SPIN_KEY) == "0"
        quiet.reload(tiny_copy)
        assert not _ort_spins(quiet), "the reloaded generation opens as the first did"
    with rlopt.load(tiny_copy, "policy", backend="onnxruntime", spinning=False) as named:
        assert named._gen.runners["onnxruntime"]._session.get_session_options().get_session_config_entry(
            SPIN_KEY) == "0"
