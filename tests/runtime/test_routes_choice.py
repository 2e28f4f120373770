"""`auto`'s route chosen from recorded latency tables (`choose_route`) and read back from the manifest."""

from __future__ import annotations

import pytest

from rlopt.backends.capability import TunedRoute
from rlopt.compile.auto import ChooseAuto
from rlopt.facts import NetworkFacts
from rlopt.manifest import FileRecord, InputProfile, NetworkRecord, shape_label
from rlopt.runtime.routes import OTHER, choose_route, parse_label, recorded_plan

SHAPES = ["1x17", "16x17", "64x17", OTHER]
ORT_ALONE = dict(zip(SHAPES, [30.0, 40.0, 60.0, 40.0]))
TVM_ALONE = dict(zip(SHAPES, [15.0, 50.0, 90.0, 900.0]))  # untuned: fast at batch 1, slow elsewhere


def _choice(together: dict[str, list[float]], alone: dict[str, dict[str, float]] | None = None):
    alone = alone or {"onnxruntime": ORT_ALONE, "tvm": TVM_ALONE}
    return choose_route(alone, {b: dict(zip(SHAPES, v)) for b, v in together.items()}, SHAPES,
                        ["onnxruntime", "tvm"])


def test_a_mix_that_wins_at_one_shape_is_kept_and_every_backend_runs_as_alone() -> None:
    choice = _choice({"onnxruntime": [30.0, 41.0, 61.0, 41.0], "tvm": [16.0, 52.0, 95.0, 950.0]})
    assert choice.mixed and choice.single == "onnxruntime"
    assert choice.per_point == {"1x17": "tvm", "16x17": "onnxruntime", "64x17": "onnxruntime",
                                OTHER: "onnxruntime"}
    assert ChooseAuto.options(choice.per_point, {}) == {}, "ORT spins in the mix: its companion has no threads"
    assert choice.compared["1x17"] == pytest.approx(16 / 30), "TVM's slower figure over ORT's faster one"
    assert choice.compared["16x17"] == 1.0, "the holder runs as alone"
    assert "mixed kept" in choice.reason and "1x17 0.53x" in choice.reason


def test_only_a_companion_joins_the_holder() -> None:
    """A backend that runs a pool of its own (torchscript's intra-op threads) would fight ORT's pool for the cores:
    it may win a whole route, never a shape beside another pool."""
    alone = {"onnxruntime": ORT_ALONE, "torchscript": dict(zip(SHAPES, [12.0, 50.0, 80.0, 50.0]))}
    together = {"onnxruntime": ORT_ALONE, "torchscript": alone["torchscript"]}
    free = choose_route(alone, together, SHAPES, ["onnxruntime", "torchscript"], preferred=["onnxruntime"])
    assert free.per_point["1x17"] == "torchscript" and free.single == "onnxruntime"
    whole = choose_route(alone, together, SHAPES, ["onnxruntime", "torchscript"], preferred=["onnxruntime"],
                         companions={"tvm"})
    assert set(whole.per_point.values()) == {"torchscript"} and not whole.mixed, "worst shape 1.33x against 2.5x"
    held = choose_route(alone, together, SHAPES, ["onnxruntime", "torchscript"], preferred=["onnxruntime"],
                        companions={"tvm"}, rivals=["openvino"])
    assert set(held.per_point.values()) == {"onnxruntime"}, "only a rival may hold instead"
    slow = {**alone, "torchscript": {**alone["torchscript"], "64x17": 150.0}}
    kept = choose_route(slow, {**together, "torchscript": slow["torchscript"]}, SHAPES,
                        ["onnxruntime", "torchscript"], preferred=["onnxruntime"], companions={"tvm"})
    assert set(kept.per_point.values()) == {"onnxruntime"} and not kept.mixed, "2.5x worst shape either way"


def test_noise_of_the_single_backend_at_a_shape_the_mix_leaves_to_it_does_not_reject_the_mix() -> None:
    """decision_transformer as a bench run measured it: TVM alone was the best single backend, ONNX Runtime one
    thread 13% faster at 8x8x8, and TVM's two timings at 1x8x8 (25.0 alone, 27.2 together) rejected the mix as
    1.09x."""
    alone = {"onnxruntime": {"1x8x8": 81.4, "4x8x8": 108.8, "8x8x8": 129.3, OTHER: 114.7},
             "tvm": {"1x8x8": 25.0, "4x8x8": 77.9, "8x8x8": 136.3, OTHER: 146.2}}
    together = {"onnxruntime": {"1x8x8": 79.5, "4x8x8": 100.6, "8x8x8": 118.9, OTHER: 112.4},
                "tvm": {"1x8x8": 27.2, "4x8x8": 77.2, "8x8x8": 136.9, OTHER: 144.9}}
    choice = choose_route(alone, together, ["1x8x8", "4x8x8", "8x8x8", OTHER], ["tvm", "onnxruntime"])
    assert choice.mixed and choice.single == "tvm"
    assert choice.per_point == {"1x8x8": "tvm", "4x8x8": "tvm", "8x8x8": "onnxruntime", OTHER: "onnxruntime"}
    assert choice.compared["1x8x8"] == 1.0 and choice.compared["8x8x8"] == pytest.approx(129.3 / 136.3)
    held = choose_route(alone, together, ["1x8x8", "4x8x8", "8x8x8", OTHER], ["tvm", "onnxruntime"],
                        preferred=["onnxruntime"])
    assert held.single == "tvm" and held.per_point == choice.per_point, "TVM is clearly faster overall: it holds"


def test_a_gain_within_noise_is_not_worth_a_second_backend() -> None:
    choice = _choice({"onnxruntime": [30.0, 40.0, 60.0, 40.0], "tvm": [29.0, 52.0, 95.0, 950.0]})
    assert not choice.mixed and set(choice.per_point.values()) == {"onnxruntime"}
    assert "no other backend clearly faster" in choice.reason, "3% is within the noise"
    small = _choice({"onnxruntime": [30.0, 40.0, 60.0, 40.0], "tvm": [27.5, 52.0, 95.0, 950.0]},
                    {"onnxruntime": ORT_ALONE, "tvm": {**TVM_ALONE, "1x17": 27.5}})
    assert not small.mixed and "under 10% faster anywhere" in small.reason, "clearly faster, but by 8%"


def test_a_shape_only_one_backend_serves_goes_to_it_and_that_backend_is_the_only_single_candidate() -> None:
    tvm_partial = {k: v for k, v in TVM_ALONE.items() if k != "64x17"}
    tvm_partial["16x17"] = 20.0  # TVM would be the best single backend if it served every shape
    choice = _choice({"onnxruntime": [30.0, 41.0, 61.0, 41.0], "tvm": [16.0, 21.0]},
                     {"onnxruntime": ORT_ALONE, "tvm": tvm_partial})
    assert choice.single == "onnxruntime"
    assert choice.per_point["64x17"] == "onnxruntime" and choice.per_point["16x17"] == "tvm" and choice.mixed
    split = choose_route({"a": {"s": 1.0}, "b": {"t": 2.0}}, {"a": {"s": 1.0}, "b": {"t": 2.0}}, ["s", "t"],
                         ["a", "b"])
    assert split.per_point == {"s": "a", "t": "b"} and split.mixed and "no single backend" in split.reason


def test_when_the_mix_cannot_be_measured_every_shape_goes_to_the_single_fastest_backend() -> None:
    alone = {"onnxruntime": ORT_ALONE, "tvm": {k: v / 2 for k, v in ORT_ALONE.items()}}
    choice = choose_route(alone, None, SHAPES, ["onnxruntime", "tvm"], "tensorrt cannot run here")
    assert choice.per_point == dict.fromkeys(SHAPES, "tvm") and not choice.mixed
    assert choice.reason == "tvm alone: mixed route not measured (tensorrt cannot run here)"


def test_a_per_shape_best_that_is_one_backend_is_that_backend_alone() -> None:
    choice = _choice({"onnxruntime": [10.0, 10.0, 10.0, 10.0], "tvm": [16.0, 52.0, 95.0, 950.0]})
    assert not choice.mixed and choice.per_point == dict.fromkeys(SHAPES, "onnxruntime")


def test_the_preferred_backend_holds_every_shape_another_does_not_clearly_win() -> None:
    """ONNX Runtime holds ties (`Backend.holds_ties`): TVM 4% faster at 16x17 is noise, 2x at 1x17 is not."""
    alone = {"onnxruntime": ORT_ALONE, "tvm": dict(zip(SHAPES, [15.0, 38.5, 90.0, 900.0]))}
    together = {"onnxruntime": dict(zip(SHAPES, [30.0, 40.0, 60.0, 40.0])), "tvm": alone["tvm"]}
    choice = choose_route(alone, together, SHAPES, ["tvm", "onnxruntime"], preferred=["onnxruntime"])
    assert choice.single == "onnxruntime" and choice.mixed
    assert choice.per_point == {"1x17": "tvm", "16x17": "onnxruntime", "64x17": "onnxruntime", OTHER: "onnxruntime"}
    wider = choose_route(alone, together, SHAPES, ["tvm", "onnxruntime"], preferred=["onnxruntime"],
                         margins={"1x17": 1.5})
    assert not wider.mixed and set(wider.per_point.values()) == {"onnxruntime"}, "noise of 2.5x: 2x is not clear"


def test_a_backend_clearly_faster_everywhere_holds_and_a_one_thread_challenger_must_win_in_cpu_time_too() -> None:
    fast = {"tvm": dict(zip(SHAPES, [5.0, 10.0, 20.0, 20.0])), "onnxruntime": ORT_ALONE}
    together = {"tvm": fast["tvm"], "onnxruntime": dict(zip(SHAPES, [30.0, 40.0, 60.0, 40.0]))}
    choice = choose_route(fast, together, SHAPES, ["onnxruntime", "tvm"], preferred=["onnxruntime"])
    assert choice.per_point == dict.fromkeys(SHAPES, "tvm") and not choice.mixed and choice.single == "tvm"
    same_cpu = {"tvm": dict(zip(SHAPES, [28.0, 38.0, 58.0, 38.0])), "onnxruntime": dict(zip(SHAPES, [29.0, 39.0,
                                                                                               59.0, 39.0]))}
    held = choose_route(fast, together, SHAPES, ["onnxruntime", "tvm"], preferred=["onnxruntime"], cpu=same_cpu)
    assert set(held.per_point.values()) == {"onnxruntime"}, "as fast on one thread: the walls were the pool's load"
    pooled = choose_route(fast, together, SHAPES, ["tvm", "onnxruntime"], preferred=["onnxruntime"], cpu=same_cpu,
                          pools={"tvm": SHAPES})
    assert set(pooled.per_point.values()) == {"tvm"}, "where the challenger runs a pool its CPU figure says nothing"


def test_labels_parse_back_to_shape_keys() -> None:
    for key in [((1, 17),), ((2, 3, 32), (2, 8)), ((4,), ())]:
        assert parse_label(shape_label(key)) == key


def _record(route: dict | None) -> NetworkRecord:
    profile = {"obs": InputProfile(dtype="float32", min=[1, 17], opt=[16, 17], max=[64, 17])}
    file = FileRecord(path="value/reference.npz", sha256="0" * 64, bytes=1)
    return NetworkRecord(kind="value", module="value", inputs=profile, outputs=["value"], precision="fp32",
                         tolerance={}, reference=file, artifacts={},
                         facts=NetworkFacts.model_validate({"route": route} if route else {}))


def test_the_runtime_runs_the_recorded_route_and_never_rechooses() -> None:
    mixed = _record({"routes": {"1x17": "tvm", "16x17": "onnxruntime", OTHER: "onnxruntime"},
                     "options": {"onnxruntime": {"allow_spinning": False}}})
    plan = recorded_plan(mixed, ["onnxruntime", "tvm"])
    assert plan.routes == {((1, 17),): "tvm", ((16, 17),): "onnxruntime"} and plan.fallback == "onnxruntime"
    assert plan.options == {"onnxruntime": {"allow_spinning": False}}
    single = recorded_plan(_record({"routes": {"1x17": "onnxruntime", OTHER: "onnxruntime"}}), ["tvm", "onnxruntime"])
    assert set(single.routes.values()) == {"onnxruntime"} and single.options == {}
    one_thread = recorded_plan(_record({"routes": {"1x17": "onnxruntime", OTHER: "onnxruntime"},
                                        "options": {"onnxruntime": {"intra_op_threads": 1}}}), ["onnxruntime"])
    assert one_thread.options == {"onnxruntime": {"intra_op_threads": 1}}


def test_a_recorded_route_that_cannot_run_here_becomes_the_best_usable_backend_alone() -> None:
    plan = recorded_plan(_record({"routes": {"1x17": "tensorrt", OTHER: "onnxruntime"},
                                  "options": {"onnxruntime": {"allow_spinning": False}}}), ["onnxruntime", "tvm"])
    assert plan.routes == {} and plan.fallback == "onnxruntime" and plan.options == {}, "as built: spinning"
    assert "tensorrt" in plan.why
    assert recorded_plan(_record(None), ["tvm"]).fallback == "tvm"


def test_a_route_opens_each_backend_with_its_own_choice_per_shape() -> None:
    routes = {"1x17": "tvm", "16x17": "onnxruntime", OTHER: "onnxruntime"}
    threads = TunedRoute({}, None, lambda labels: {"intra_op_threads": 1, "shape_threads": {"16x17": 0}}
                         if "16x17" in labels else {"intra_op_threads": 1})
    assert ChooseAuto.options(routes, {"onnxruntime": threads}) == {
        "onnxruntime": {"intra_op_threads": 1, "shape_threads": {"16x17": 0}}}
    assert ChooseAuto.options(dict.fromkeys(routes, "tvm"), {"onnxruntime": threads}) == {}, \
        "a backend off the route is not opened"


def test_a_challenger_counts_its_slower_timing() -> None:
    # torchscript timed 0.6 ms beside the others but 390 ms alone (a stalled pool): the same configuration, so the
    # mix must not count on the lucky figure
    alone = {"onnxruntime": ORT_ALONE, "torchscript": dict(zip(SHAPES, [35.0, 45.0, 390_000.0, 45.0]))}
    together = {"onnxruntime": dict(zip(SHAPES, [30.0, 40.0, 60.0, 40.0])),
                "torchscript": dict(zip(SHAPES, [35.0, 45.0, 40.0, 45.0]))}
    choice = choose_route(alone, together, SHAPES, ["onnxruntime", "torchscript"])
    assert not choice.mixed and set(choice.per_point.values()) == {"onnxruntime"}


def test_a_pool_backend_clearly_better_at_its_worst_shape_holds_and_one_thread_shapes_join_it() -> None:
    """mlp-o4-h256-relu as the bench measured it: OpenVINO's pool 1.3x faster than ONNX Runtime's at 256 rows, slow at
    batch 1. Two pools never share a route, so OpenVINO holds it and the shapes where ONNX Runtime runs one thread
    (or TVM does) join it as companions."""
    shapes = ["1x4", "64x4", "256x4", OTHER]
    alone = {"onnxruntime": dict(zip(shapes, [13.0, 114.0, 308.0, 114.0])),
             "openvino": dict(zip(shapes, [40.0, 116.0, 237.0, 116.0])),
             "tvm": dict(zip(shapes, [8.0, 300.0, 900.0, 300.0]))}
    together = {"onnxruntime": alone["onnxruntime"], "tvm": alone["tvm"]}
    pools = {"onnxruntime": ["256x4", OTHER]}
    choice = choose_route(alone, together, shapes, ["onnxruntime", "openvino", "tvm"], preferred=["onnxruntime"],
                          pools=pools, companions={"tvm"})
    assert choice.single == "openvino" and choice.mixed
    assert choice.per_point == {"1x4": "tvm", "64x4": "openvino", "256x4": "openvino", OTHER: "openvino"}
    assert choice.reason.startswith("openvino holds (where the routes differ, its worst shape is 1.02x the fastest "
                                    "there, onnxruntime's 1.30x)")
    faster_one = {**alone, "onnxruntime": {**alone["onnxruntime"], "64x4": 90.0}}
    joined = choose_route(faster_one, {**together, "onnxruntime": faster_one["onnxruntime"]}, shapes,
                          ["onnxruntime", "openvino", "tvm"], preferred=["onnxruntime"], pools=pools,
                          companions={"tvm"})
    assert joined.per_point["64x4"] == "onnxruntime", "one thread there: a companion of OpenVINO's pool"
    close = {**alone, "openvino": {**alone["openvino"], "256x4": 290.0}}
    held = choose_route(close, together, shapes, ["onnxruntime", "openvino", "tvm"], preferred=["onnxruntime"],
                        pools=pools, companions={"tvm"})
    assert held.single == "onnxruntime" and "openvino" not in held.per_point.values(), "6% is within the noise"


def test_the_preferred_backend_is_unseated_only_by_the_challengers_slower_figure() -> None:
    """gru_sequence_encoder in a bench compile: ONNX Runtime's workers read 3x slower than the same configuration
    timed in the compiling process (96 against 31 us at 1x16x8), and TVM's alone figures, faster than that, made it
    the route's holder: the shipped route ran 2.9x ONNX Runtime's best. The holder moves only when the challenger's
    slower figure beats the preferred one's faster figure, as for a shape."""
    shapes = ["1x16x8", "4x16x8", "8x16x8", OTHER]
    alone = {"onnxruntime": dict(zip(shapes, [96.0, 166.8, 278.8, 165.7])),
             "tvm": dict(zip(shapes, [97.8, 102.2, 139.2, 123.1]))}
    together = {"onnxruntime": dict(zip(shapes, [31.1, 63.5, 116.9, 60.5])),
                "tvm": dict(zip(shapes, [93.4, 101.6, 115.2, 115.8]))}
    choice = choose_route(alone, together, shapes, ["onnxruntime", "tvm"], preferred=["onnxruntime"],
                          companions={"tvm"}, rivals=["openvino"])
    assert choice.single == "onnxruntime" and set(choice.per_point.values()) == {"onnxruntime"}
    clear = {**together, "tvm": {p: v / 3 for p, v in together["tvm"].items()}}
    faster = {**alone, "tvm": {p: v / 3 for p, v in alone["tvm"].items()}}
    assert choose_route(faster, clear, shapes, ["onnxruntime", "tvm"], preferred=["onnxruntime"],
                        companions={"tvm"}, rivals=["openvino"]).single == "tvm", "3x faster in both: it holds"


VALUE_SHAPES = ["1x1x768", "4x8x768", "8x16x768", OTHER]
VALUE_ORT = dict(zip(VALUE_SHAPES, [17.14, 96.0, 300.0, 96.0]))  # the pool at every shape (tuned so)


def _value_route(tvm_alone: float, tvm_together: float, tvm_cpu: float | None = None,
                 pools: list[str] | None = None):
    """The default value head as a compile on the AMD host measured it: at batch 1 TVM on one thread 16.75 us
    alone and 17.58 together, ONNX Runtime's pool 17.14 and 18.88; TVM far slower at the larger shapes."""
    alone = {"onnxruntime": VALUE_ORT, "tvm": dict(zip(VALUE_SHAPES, [tvm_alone, 150.0, 600.0, 150.0]))}
    together = {"onnxruntime": {**VALUE_ORT, "1x1x768": 18.88},
                "tvm": dict(zip(VALUE_SHAPES, [tvm_together, 150.0, 600.0, 150.0]))}
    cpu = {"onnxruntime": dict(zip(VALUE_SHAPES, [27.0, 120.0, 450.0, 120.0]))}
    if tvm_cpu is not None:
        cpu["tvm"] = dict(zip(VALUE_SHAPES, [tvm_cpu, 150.0, 600.0, 150.0]))
    return choose_route(alone, together, VALUE_SHAPES, ["onnxruntime", "tvm"], preferred=["onnxruntime"], cpu=cpu,
                        pools={"onnxruntime": VALUE_SHAPES if pools is None else pools}, companions={"tvm"},
                        rivals=["openvino"])


def test_a_one_thread_companion_within_the_noise_of_the_holders_pool_takes_a_short_call() -> None:
    """One compile read TVM 16.75 against the pool's 17.14 us (no clear win, ONNX Runtime kept batch 1), the one
    before 14.27 against 19.26 (TVM took it): the same speed on one core is the better and the stable choice."""
    choice = _value_route(16.75, 17.58, tvm_cpu=16.9)
    assert choice.mixed and choice.single == "onnxruntime"
    assert choice.per_point == {"1x1x768": "tvm", "4x8x768": "onnxruntime", "8x16x768": "onnxruntime",
                                OTHER: "onnxruntime"}
    assert "one thread within the noise of onnxruntime's pool at 1x1x768" in choice.reason
    assert choice.per_point == _value_route(14.27, 14.9, tvm_cpu=14.3).per_point, "a clear win routes the same"


@pytest.mark.parametrize(("tvm_alone", "tvm_together", "tvm_cpu", "pools", "why"), [
    (18.5, 19.0, 18.6, None, "8% slower than the pool's faster figure: clearly slower"),
    (16.75, 17.58, 29.0, None, "clearly slower in CPU time than ONNX Runtime's one-thread configuration"),
    (16.75, 17.58, 16.9, ["4x8x768", "8x16x768", OTHER], "ONNX Runtime runs one thread there: no pool to spare"),
])
def test_the_holder_keeps_a_shape_its_companion_does_not_tie(tvm_alone: float, tvm_together: float,
                                                             tvm_cpu: float, pools: list[str], why: str) -> None:
    choice = _value_route(tvm_alone, tvm_together, tvm_cpu, pools)
    assert not choice.mixed and set(choice.per_point.values()) == {"onnxruntime"}, why


def test_a_long_call_is_never_a_tie_a_pool_gains_there_on_a_quiet_machine() -> None:
    """Beside a busy core a pool reads about one thread's speed; above POOL_WORTH_US it is 1.4-1.6x faster on a
    quiet one, so a tie there must not hand the shape to one thread."""
    shapes = ["64x376", "256x376"]
    alone = {"onnxruntime": dict(zip(shapes, [150.0, 500.0])), "tvm": dict(zip(shapes, [152.0, 505.0]))}
    choice = choose_route(alone, alone, shapes, ["onnxruntime", "tvm"], preferred=["onnxruntime"],
                          pools={"onnxruntime": shapes}, companions={"tvm"})
    assert not choice.mixed and set(choice.per_point.values()) == {"onnxruntime"}
