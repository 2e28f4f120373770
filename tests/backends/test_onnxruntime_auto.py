"""ONNX Runtime's threads in `auto` (rlopt.backends.onnxruntime.auto): one thread or the pool, per shape, from the
figures compile measured; the options the route opens the session with."""

from __future__ import annotations

from rlopt.backends.onnxruntime.auto import ONE_THREAD, POOL_WORTH_US, THREADS, upgrade_v1_facts
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


def test_a_short_call_runs_one_thread_unless_the_pool_is_clearly_faster() -> None:
    default, one = {"1x4": 10.0, "64x4": 40.0}, {"1x4": 8.0, "64x4": 30.0}
    tuned, options = _choose(default, one, ({"1x4": 12.0, "64x4": 55.0}, {"1x4": 8.5, "64x4": 31.0}))
    assert options == {"intra_op_threads": 1} and dict(tuned.alone) == one
    assert tuned.together == {"1x4": 8.5, "64x4": 31.0}
    assert tuned.why.endswith("1x4 1 thread 1.25x, 64x4 1 thread 1.33x")
    assert tuned.configurations == {"1x4": ONE_THREAD, "64x4": ONE_THREAD}
    # sb3-ppo-cartpole's value net in a worker: level at 1x4 and 64x4, the pool 1.15x faster at 256x4
    tuned, options = _choose({"1x4": 13.04, "64x4": 26.18, "256x4": 61.82, "other": 26.3},
                             {"1x4": 12.84, "64x4": 25.86, "256x4": 70.94, "other": 25.9})
    assert options == {"intra_op_threads": 1, "shape_threads": {"256x4": 0}}, "one thread; 256x4 on the pool"
    assert dict(tuned.alone) == {"1x4": 12.84, "64x4": 25.86, "256x4": 61.82, "other": 25.9}
    assert "256x4 pool 1.15x" in tuned.why and "1x4 1 thread 1.02x" in tuned.why
    assert tuned.options(["1x4", "other"]) == {"intra_op_threads": 1}, "256x4 not routed here: no session of its own"
    # without OTHER, the configuration most shapes take is the session's
    assert _choose({"1x4": 10.0, "64x4": 20.0, "256x4": 50.0}, {"1x4": 9.0, "64x4": 15.0, "256x4": 40.0})[1] == \
        {"intra_op_threads": 1}
    assert THREADS.choose({"": default}, None, SMALL) is None, "one thread was not timed"


def test_a_long_call_keeps_the_pool_unless_one_thread_is_clearly_faster() -> None:
    """The default policy head: quiet, the pool 1.37x / 1.58x faster at opt and max; beside a busy core it reads
    about one thread's speed. Both ship the pool there, and one thread at batch 1 (a short call, level)."""
    quiet_pool, quiet_one = [21.1, 106.2, 301.8, 106.2], [21.4, 145.6, 475.5, 145.6]
    busy_pool, busy_one = [30.0, 190.0, 640.0, 190.0], [28.0, 200.0, 690.0, 200.0]
    labels = ["1x1x768", "4x8x768", "8x16x768", "other"]
    cpu = {ONE_THREAD: dict(zip(labels, [21.5, 148.0, 480.0, 148.0]))}
    options = [THREADS.choose({"": dict(zip(labels, pool)), ONE_THREAD: dict(zip(labels, one))}, None, SMALL,
                              {label: 0.1 for label in labels}, cpu).options(labels)  # type: ignore[union-attr]
               for pool, one in [(quiet_pool, quiet_one), (busy_pool, busy_one)]]
    assert options[0] == options[1] == {"shape_threads": {"1x1x768": 1}}
    tuned = THREADS.choose({"": dict(zip(labels, quiet_pool)), ONE_THREAD: dict(zip(labels, quiet_one))}, None, SMALL,
                           {label: 0.1 for label in labels}, cpu)
    assert tuned is not None and tuned.options(["1x1x768"]) == {"intra_op_threads": 1}, \
        "routed only its one-thread shape (another backend's pool holds the rest): no pool of its own"
    assert POOL_WORTH_US == 100.0


def test_a_noisy_measurement_needs_a_wider_win_to_move_a_shape() -> None:
    pool, one = {"a": 200.0, "b": 400.0}, {"a": 160.0, "b": 300.0}  # long calls: the pool holds within the margin
    tuned = THREADS.choose({"": pool, ONE_THREAD: one}, None, SMALL, {"a": 0.3, "b": 0.3})
    assert tuned is not None and tuned.options(list(pool)) == {"shape_threads": {"b": 1}}, \
        "1.25x is within a 1.3x A/A noise; 1.33x is not"


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


def test_a_long_call_measured_beside_a_busy_core_keeps_the_pool() -> None:
    """The default value head compiled beside a busy core: its pool read 1.27x slower than one thread at 4x8x768
    (176.5 against 138.8 us), and 1.57x faster on the quiet machine minutes later. Under load the figures do not
    say how the pool runs on a quiet one: a long call keeps the pool; a short one is decided as ever."""
    labels = ["1x1x768", "4x8x768", "8x16x768", "other"]
    pool, one = [36.76, 176.53, 627.27, 173.56], [24.74, 138.78, 508.39, 134.68]
    tables = {"": dict(zip(labels, pool)), ONE_THREAD: dict(zip(labels, one))}
    cpu = {ONE_THREAD: dict(zip(labels, [25.55, 139.59, 509.78, 135.49]))}
    quiet = THREADS.choose(tables, None, SMALL, None, cpu)
    busy = THREADS.choose(tables, None, SMALL, None, cpu, contended=True)
    assert quiet is not None and busy is not None
    assert quiet.options(labels[1:]) == {"intra_op_threads": 1}, "taken at face value: one thread"
    assert busy.options(labels[1:]) == {}, "contended: the pool wherever one thread's call is 100 us or more"
    assert busy.configurations["1x1x768"] == ONE_THREAD, "a 25 us call: one thread, as when quiet"
