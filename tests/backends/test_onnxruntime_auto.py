"""ONNX Runtime's threads in `auto` (rlopt.backends.onnxruntime.auto): one thread or the pool, per shape, from the
figures compile measured; the options the route opens the session with."""

from __future__ import annotations

from rlopt.backends.onnxruntime.auto import ONE_THREAD, THREADS, upgrade_v1_facts
from rlopt.backends.onnxruntime.facts import SECOND_SESSION_MAX_BYTES, OnnxRuntimeFacts

SMALL, LARGE = 1 << 20, SECOND_SESSION_MAX_BYTES + 1


def _choose(pool: dict[str, float], one: dict[str, float], together: tuple[dict[str, float], dict[str, float]] | None
            = None, size: int = SMALL):
    """THREADS.choose on the pool's and one thread's rows; the options for every label routed to ONNX Runtime."""
    tuned = THREADS.choose({"": pool, ONE_THREAD: one},
                           {"": together[0], ONE_THREAD: together[1]} if together else None, size)
    assert tuned is not None
    return tuned, tuned.options(list(pool))


def test_one_thread_is_timed_only_where_the_artifact_runs_a_pool_of_several() -> None:
    assert THREADS.variants(OnnxRuntimeFacts(), 2) == {ONE_THREAD: {"intra_op_threads": 1}}
    assert THREADS.variants(OnnxRuntimeFacts(), 1) == {}
    assert THREADS.variants(OnnxRuntimeFacts(intra_op_threads=1), 4) == {}


def test_each_shape_runs_on_whichever_of_one_thread_and_the_pool_was_faster_there() -> None:
    default, one = {"1x4": 10.0, "64x4": 40.0}, {"1x4": 8.0, "64x4": 30.0}
    tuned, options = _choose(default, one, ({"1x4": 12.0, "64x4": 55.0}, {"1x4": 8.5, "64x4": 31.0}))
    assert options == {"intra_op_threads": 1} and dict(tuned.alone) == one
    assert tuned.together == {"1x4": 8.5, "64x4": 31.0}
    assert tuned.why.endswith("1x4 1 thread 1.25x, 64x4 1 thread 1.33x")
    # sb3-ppo-cartpole's value net in a worker: level at 1x4 and 64x4, the pool 1.15x faster at 256x4
    tuned, options = _choose({"1x4": 13.04, "64x4": 26.18, "256x4": 61.82, "other": 26.3},
                             {"1x4": 12.84, "64x4": 25.86, "256x4": 70.94, "other": 25.9})
    assert options == {"intra_op_threads": 1, "shape_threads": {"256x4": 0}}, "one thread; 256x4 on the pool"
    assert dict(tuned.alone) == {"1x4": 12.84, "64x4": 25.86, "256x4": 61.82, "other": 25.9}
    assert "256x4 pool 1.15x" in tuned.why and "1x4 1 thread 1.02x" in tuned.why
    assert tuned.options(["1x4", "other"]) == {"intra_op_threads": 1}, "256x4 not routed here: no session of its own"
    # recurrent_ppo_lstm: the pool faster everywhere but at 8x8, where one thread is
    tuned, options = _choose({"1x8": 27.1, "4x8": 27.33, "8x8": 49.0, "other": 27.6},
                             {"1x8": 44.02, "4x8": 45.42, "8x8": 48.23, "other": 42.9})
    assert options == {"shape_threads": {"8x8": 1}} and tuned.alone["8x8"] == 48.23
    # without OTHER, the configuration most shapes take is the session's; a tie is one thread
    assert _choose({"1x4": 10.0, "64x4": 20.0, "256x4": 50.0}, {"1x4": 10.0, "64x4": 25.0, "256x4": 60.0})[1] == \
        {"shape_threads": {"1x4": 1}}
    assert THREADS.choose({"": default}, None, SMALL) is None, "one thread was not timed"


def test_a_graph_too_large_to_open_twice_keeps_one_configuration_for_every_shape() -> None:
    pool = {"1x4": 13.04, "64x4": 25.86, "256x4": 61.82}
    one = {"1x4": 12.84, "64x4": 26.18, "256x4": 70.94}
    tuned, options = _choose(pool, one, size=LARGE)
    assert options == {} and dict(tuned.alone) == pool
    assert _choose({**pool, "1x4": 14.6}, one, size=LARGE)[1] == {"intra_op_threads": 1}, \
        "as much lost at 1x4 as won at 256x4"


def test_a_version_1_route_reads_as_options() -> None:
    mixed = {"auto_routes": {"1x17": "tvm", "other": "onnxruntime"}, "auto_onnxruntime_spinning": False,
             "auto_onnxruntime_threads": 1, "auto_onnxruntime_shape_threads": {"256x17": 0}, "triton": []}
    assert upgrade_v1_facts(mixed) == {"allow_spinning": False, "intra_op_threads": 1,
                                       "shape_threads": {"256x17": 0}}
    assert mixed == {"auto_routes": {"1x17": "tvm", "other": "onnxruntime"}, "triton": []}
    assert upgrade_v1_facts({"auto_routes": {"1x17": "onnxruntime", "other": "onnxruntime"}}) == {}
    assert upgrade_v1_facts({"auto_routes": {"1x17": "tvm", "other": "onnxruntime"}}) == {"allow_spinning": False}, \
        "unrecorded spinning: off where the route mixed backends, as rlopt 0.5 loaded it"
