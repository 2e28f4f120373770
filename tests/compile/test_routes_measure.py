"""Compile's `auto` measurement: interleaved rounds per configuration, and which candidates it times."""

from __future__ import annotations

import time

from rlopt.compile.measure import ORT_ONE_THREAD, interleaved_medians, ort_thread_choice, outclassed


def test_interleaved_medians_time_every_cell_of_every_configuration() -> None:
    def sleeper(us: float):
        return lambda: time.sleep(us / 1e6)

    configurations = {"alone a": {("a", "s"): sleeper(200)},
                      "together": {("a", "s"): sleeper(200), ("b", "s"): sleeper(1000)}}
    medians, rounds = interleaved_medians(configurations, rounds=3)
    assert rounds == 3
    assert set(medians) == set(configurations) and set(medians["together"]) == {("a", "s"), ("b", "s")}
    assert medians["together"]["b", "s"] > 3 * medians["together"]["a", "s"]
    assert 200 <= medians["alone a"]["a", "s"] < 20000
    slow = {"c": {("a", "s"): sleeper(20_000)}}
    _, rounds = interleaved_medians(slow, rounds=5, estimates_us={"a": {"s": 20_000.0}}, budget_s=0.01)
    assert rounds == 1, "no round starts once the budget is spent, but one always runs"


def test_a_backend_over_twice_as_slow_at_every_shape_is_not_timed() -> None:
    named = {"1x17": "min", "64x17": "max"}
    recorded = {"onnxruntime": {"1x17": 10.0, "64x17": 25.0, "other": 16.0},
                "tvm": {"1x17": 7.0, "64x17": 190.0, "other": 900.0},
                "torchscript": {"1x17": 30.0, "64x17": 52.0}}
    assert outclassed(recorded, "torchscript", named), "3x and 2.1x ONNX Runtime"
    assert not outclassed(recorded, "tvm", named), "fastest at 1x17"
    assert not outclassed(recorded, "onnxruntime", named)


def test_onnxruntime_gets_one_thread_only_when_one_thread_wins_as_a_mix_must() -> None:
    default, one = {"1x4": 10.0, "64x4": 40.0}, {"1x4": 8.0, "64x4": 30.0}
    alone = {"onnxruntime": default, ORT_ONE_THREAD: one, "tvm": {"1x4": 5.0, "64x4": 200.0}}
    together = {"onnxruntime": {"1x4": 12.0, "64x4": 55.0}, ORT_ONE_THREAD: {"1x4": 8.5, "64x4": 31.0}}
    threads, ranked_alone, ranked_together = ort_thread_choice(alone, together)
    assert threads == 1 and ranked_alone["onnxruntime"] == one and ranked_alone["tvm"] == alone["tvm"]
    assert ranked_together is not None and ranked_together["onnxruntime"] == together[ORT_ONE_THREAD]
    mixed_result = {**alone, ORT_ONE_THREAD: {"1x4": 7.0, "64x4": 43.0}}  # 30% faster at 1x4, 7.5% slower at 64x4
    assert ort_thread_choice(mixed_result, together) == (None, mixed_result, together)
    within_noise = {**alone, ORT_ONE_THREAD: {"1x4": 9.5, "64x4": 38.0}}
    assert ort_thread_choice(within_noise, together)[0] is None, "5% is not a gain"
    assert ort_thread_choice({"onnxruntime": default}, None) == (None, {"onnxruntime": default}, None)
