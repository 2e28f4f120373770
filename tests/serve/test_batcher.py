"""`rlopt.Batcher`: the batching rule on a fake clock (`Scheduler`), stacking and splitting on a fake session,
priorities, timeouts, error isolation, close; and a real Session at 16 threads."""

from __future__ import annotations

import threading
from concurrent.futures import Future
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import rlopt
from rlopt.manifest import InputProfile
from rlopt.serve.batcher import Batcher, BatcherClosed, Request, RequestTimeout, Scheduler
from rlopt.serve.padding import PaddingPlan


def request(rows: int = 1, dims: tuple = ((8,),), priority: int = 0, arrived: float = 0.0,
            deadline: float | None = None) -> Request:
    return Request({}, rows, dims, priority, arrived, deadline, Future())


def test_a_lone_request_runs_at_once() -> None:
    scheduler = Scheduler(max_batch=8, max_wait_s=1e-3, row_limit=16)
    only = request()
    scheduler.add(only)
    assert scheduler.take(now=0.0) == [only]


def test_it_waits_for_the_rows_recent_batches_held_but_not_past_max_wait() -> None:
    scheduler = Scheduler(max_batch=8, max_wait_s=1e-3, row_limit=16)
    scheduler.expected[((8,),)] = 4.0
    first = request(arrived=0.0)
    scheduler.add(first)
    assert scheduler.take(now=0.0) == pytest.approx(1e-3)  # wait: fewer rows than recent batches held
    more = [request(arrived=1e-4) for _ in range(3)]
    for r in more:
        scheduler.add(r)
    assert scheduler.take(now=2e-4) == [first, *more]  # four rows: run without waiting out max_wait
    late = request(arrived=0.01)
    scheduler.add(late)
    assert scheduler.take(now=0.0105) == pytest.approx(0.011)
    assert scheduler.take(now=0.011) == [late]  # max_wait passed: run what there is
    assert scheduler.take(now=0.02) is None


def test_expected_rows_follow_the_batches_run() -> None:
    scheduler = Scheduler(max_batch=8, max_wait_s=1e-3, row_limit=16)
    for _ in range(30):
        scheduler.add(request())
        assert scheduler.take(now=0.0) != []
    assert scheduler.expected[((8,),)] == pytest.approx(1.0)


def test_buckets_priority_and_the_row_cap() -> None:
    scheduler = Scheduler(max_batch=4, max_wait_s=0.0, row_limit=16)
    small = [request(dims=((8,),)) for _ in range(3)]
    other = request(dims=((16,),), priority=0)
    urgent = request(dims=((8,),), priority=5, rows=2)
    for r in [*small, other, urgent]:
        scheduler.add(r)
    assert scheduler.take(now=0.0) == [urgent, small[0], small[1]]  # priority first, same dims only, 4 rows at most
    assert scheduler.take(now=0.0) == [small[2]]  # [1, 8] never waits for [1, 16], nor the other way round
    assert scheduler.take(now=0.0) == [other]


def test_profile_max_caps_rows_and_a_big_request_runs_alone() -> None:
    scheduler = Scheduler(max_batch=64, max_wait_s=0.0, row_limit=4)
    big, small = request(rows=4), request(rows=1)
    scheduler.add(big)
    scheduler.add(small)
    assert scheduler.take(now=0.0) == [big]
    assert scheduler.take(now=0.0) == [small]


def test_expired_requests_leave_the_queue() -> None:
    scheduler = Scheduler(max_batch=8, max_wait_s=0.0, row_limit=8)
    keep, drop = request(), request(deadline=1.0)
    scheduler.add(keep)
    scheduler.add(drop)
    assert scheduler.expire(now=2.0) == [drop]
    assert scheduler.take(now=2.0) == [keep]


def test_a_bucket_not_worth_stacking_runs_one_by_one_and_a_stacked_batch_runs_alone() -> None:
    scheduler = Scheduler(max_batch=8, max_wait_s=1e-3, row_limit=16, worth=lambda dims, rows: dims != ((8,),))
    singles = [request(dims=((8,),)) for _ in range(3)]
    for r in singles:
        scheduler.add(r)
    assert scheduler.take(now=0.0, stacking=True) == [singles[0]], "one by one, on any free worker"
    stackable = [request(dims=((16,),), arrived=0.0, deadline=0.5) for _ in range(3)]
    scheduler = Scheduler(max_batch=8, max_wait_s=1e-3, row_limit=16, worth=lambda dims, rows: True)
    for r in stackable:
        scheduler.add(r)
    assert scheduler.take(now=0.0, stacking=True) == 0.5, "a stacked batch runs: gather until it ends"
    assert scheduler.take(now=0.0, stacking=True, draining=True) == stackable
    assert scheduler.cap(((16,),)) == 8 and Scheduler(8, 0.0, 16, worth=lambda d, r: False).cap(((16,),)) == 1


def test_stacking_pays_only_where_the_stacked_run_beats_one_row_runs() -> None:
    # the default policy's [1, 8, 768] requests: named only at 4 rows (ONNX Runtime, 158 us), so one row is
    # estimated at its share (40 us); 8 rows run on the other-shape path at twice the 4-row cost
    policy = PaddingPlan({((8, 768),): [(4, 158.0)]}, 1.0, {((8, 768),): [(4, 158.0)]})
    assert policy.estimate_us(((8, 768),), 1) == pytest.approx(39.5)
    assert not policy.worth_stacking(((8, 768),), 8) and not policy.worth_stacking(((8, 768),), 4)
    # [1, 1, 768]: TVM's 17 us at one row, 4 rows on ONNX Runtime's dynamic shapes at 4 x 39 us
    heads = PaddingPlan({((1, 768),): [(1, 17.0)]}, 1.0, {((1, 768),): [(1, 39.0)]})
    assert heads.estimate_us(((1, 768),), 4) == pytest.approx(156.0) and not heads.worth_stacking(((1, 768),), 4)
    atari = PaddingPlan({((4, 84, 84),): [(1, 384.0), (8, 1310.0), (16, 2060.0)]})
    assert atari.worth_stacking(((4, 84, 84),), 8) and atari.worth_stacking(((4, 84, 84),), 3)
    assert PaddingPlan().worth_stacking(((3,),), 8), "no latencies recorded: stack"


class FakeSession:
    """Outputs `y = 2 x` row by row and `rows`, a per-row count of the rows run; records each call's rows."""

    def __init__(self, max_rows: int = 16, gate: threading.Event | None = None) -> None:
        self.inputs = {"x": InputProfile(dtype="float32", min=[1, 1], opt=[4, 3], max=[max_rows, 3])}
        self.outputs = ["y", "rows"]
        self.calls: list[int] = []
        self.gate = gate
        self.fail_on: float | None = None
        self.entered = threading.Event()

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        self.entered.set()
        if self.gate is not None:
            self.gate.wait(10)
        x = feeds["x"]
        self.calls.append(x.shape[0])
        if self.fail_on is not None and (x == self.fail_on).any():
            raise RuntimeError("this value breaks the network")
        return {"y": 2 * x, "rows": np.full((x.shape[0],), x.shape[0], np.int64)}


def queue_behind_gate(batcher: Batcher, session: FakeSession, values: list[float], **kwargs: Any) -> list[Future]:
    """Hold the worker in a first call, queue `values`, release: what queued runs as batches."""
    first = batcher.submit({"x": np.zeros((1, 3), np.float32)})
    assert session.entered.wait(10)
    futures = [batcher.submit({"x": np.full((1, 3), v, np.float32)}, **kwargs) for v in values]
    assert session.gate is not None
    session.gate.set()
    first.result(10)
    return futures


def test_stacked_requests_get_their_own_rows_back() -> None:
    session = FakeSession(gate=threading.Event())
    with Batcher(session, max_batch=8, max_wait_us=0, workers=1, padding=PaddingPlan()) as batcher:
        futures = queue_behind_gate(batcher, session, [float(v) for v in range(1, 11)])
        results = [f.result(10) for f in futures]
    for value, result in zip(range(1, 11), results):
        np.testing.assert_array_equal(result["y"], np.full((1, 3), 2.0 * value, np.float32))
    assert session.calls[1:] == [8, 2]  # ten queued: one run of 8 rows, one of 2


def test_padding_to_a_named_shape_when_recorded_faster() -> None:
    session = FakeSession(gate=threading.Event())
    plan = PaddingPlan({((3,),): [(1, 10.0), (4, 12.0), (16, 60.0)]}, other_factor=2.0)
    assert plan.target_rows(((3,),), 3) == 4 and plan.target_rows(((3,),), 4) == 4
    assert plan.target_rows(((3,),), 12) == 16  # 16 rows recorded at 60 us; 12 estimated at 48 x 2 = 96: pads
    assert PaddingPlan(plan.named, other_factor=1.0).target_rows(((3,),), 12) == 12  # 48 < 60: no padding
    assert plan.target_rows(((5,),), 3) == 3  # dims with no named shape are never padded
    with Batcher(session, max_batch=8, max_wait_us=0, workers=1, padding=plan) as batcher:
        futures = queue_behind_gate(batcher, session, [1.0, 2.0, 3.0])
        results = [f.result(10) for f in futures]
    assert session.calls[1:] == [4]  # three rows ran as the named four
    assert [r["y"].shape for r in results] == [(1, 3)] * 3 and results[2]["y"][0, 0] == 6.0
    assert all(r["rows"][0] == 4 for r in results)


def test_priority_runs_first_and_timeouts_fail_without_running() -> None:
    session = FakeSession(gate=threading.Event())
    with Batcher(session, max_batch=1, max_wait_us=0, workers=1) as batcher:
        first = batcher.submit({"x": np.zeros((1, 3), np.float32)})
        assert session.entered.wait(10)
        low = batcher.submit({"x": np.full((1, 3), 1.0, np.float32)}, priority=0)
        high = batcher.submit({"x": np.full((1, 3), 2.0, np.float32)}, priority=9)
        expired = batcher.submit({"x": np.full((1, 3), 3.0, np.float32)}, timeout_us=1)
        threading.Event().wait(0.01)
        session.gate.set()  # type: ignore[union-attr]
        first.result(10)
        assert high.result(10)["y"][0, 0] == 4.0 and low.result(10)["y"][0, 0] == 2.0
        with pytest.raises(RequestTimeout, match="not run"):
            expired.result(10)
    assert len(session.calls) == 3  # the first, then high before low; the expired one never ran


def test_a_failing_request_fails_alone() -> None:
    session = FakeSession(gate=threading.Event())
    session.fail_on = 3.0
    with Batcher(session, max_batch=8, max_wait_us=0, workers=1) as batcher:
        futures = queue_behind_gate(batcher, session, [1.0, 3.0, 5.0])
        with pytest.raises(RuntimeError, match="breaks"):
            futures[1].result(10)
        assert futures[0].result(10)["y"][0, 0] == 2.0 and futures[2].result(10)["y"][0, 0] == 10.0


def test_checks_refuse_bad_feeds_and_close_drains() -> None:
    session = FakeSession()
    batcher = Batcher(session, max_batch=4, max_wait_us=100)
    with pytest.raises(ValueError, match="dtype"):
        batcher.submit({"x": np.zeros((1, 3), np.float64)})
    with pytest.raises(ValueError, match="outside the compiled profile"):
        batcher.submit({"x": np.zeros((17, 3), np.float32)})
    pending = [batcher.submit({"x": np.ones((1, 3), np.float32)}) for _ in range(5)]
    batcher.close()
    assert all(f.done() and f.result()["y"][0, 0] == 2.0 for f in pending)
    with pytest.raises(BatcherClosed):
        batcher.submit({"x": np.ones((1, 3), np.float32)})
    with pytest.raises(ValueError, match="max_batch"):
        Batcher(session, max_batch=0)
    with pytest.raises(ValueError, match="workers"):
        Batcher(session, workers=0)


def test_outputs_without_rows_make_every_request_run_alone() -> None:
    class Pooled(FakeSession):
        def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
            self.calls.append(feeds["x"].shape[0])
            self.entered.set()
            if self.gate is not None:
                self.gate.wait(10)
            return {"y": feeds["x"].sum(keepdims=True)[0], "rows": np.zeros(1)}

    session = Pooled(gate=threading.Event())
    with Batcher(session, max_batch=8, max_wait_us=0, workers=1, padding=PaddingPlan()) as batcher:
        futures = queue_behind_gate(batcher, session, [1.0, 2.0])
        assert [f.result(10)["y"][0] for f in futures] == [3.0, 6.0]
        assert batcher.scheduler.stackable is False


def test_a_real_session_at_sixteen_threads(ort_tiny: Path) -> None:
    rng = np.random.default_rng(0)
    inputs = [rng.standard_normal((1 + i % 3, 3, 32)).astype(np.float32) for i in range(16)]
    with rlopt.load(ort_tiny, "policy") as session:
        expected = [session.run({"input0": x})["logits"] for x in inputs]
        with rlopt.Batcher(session, max_batch=8, max_wait_us=200, workers=2) as batcher:
            got: list[list[np.ndarray]] = [[] for _ in inputs]
            barrier = threading.Barrier(16)

            def actor(index: int) -> None:
                barrier.wait()
                for _ in range(20):
                    got[index].append(batcher.run({"input0": inputs[index]})["logits"])

            threads = [threading.Thread(target=actor, args=(i,)) for i in range(16)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
    for answers, reference in zip(got, expected):
        assert len(answers) == 20
        for answer in answers:
            np.testing.assert_allclose(answer, reference, rtol=1e-3, atol=1e-5)


def test_the_padding_plan_reads_the_manifests_latencies(ort_tiny: Path) -> None:
    from rlopt.manifest import read_manifest
    from rlopt.serve.padding import padding_plan

    record = read_manifest(ort_tiny).networks["policy"]
    plan = padding_plan(record, {"other": "onnxruntime"})
    latency = record.artifacts["onnxruntime"].latency_us
    assert plan.named == {((1, 32),): [(1, latency["min"].p50)], ((3, 32),): [(2, latency["opt"].p50)],
                          ((6, 32),): [(4, latency["max"].p50)]}
    assert plan.other_factor == 1.0  # ONNX Runtime serves every shape by the same path
    assert plan.target_rows(((3, 32),), 1) in (1, 2)
    with rlopt.load(ort_tiny, "policy") as session:
        with rlopt.Batcher(session, workers=1) as batcher:
            assert batcher.padding == padding_plan(session.record, session.routes)


def test_two_workers_never_run_two_stacked_batches_at_once() -> None:
    """Two small batches at once would share the cores that one full batch uses (the atari CNN on ONNX Runtime's
    pool: 4663-5111 requests/s against 6123-6353 for one at a time, 16 threads)."""
    session = FakeSession()
    running, most, lock = [0], [0], threading.Lock()
    plain = session.run

    def counted(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        threading.Event().wait(0.002)
        with lock:
            running[0] -= 1
        return plain(feeds)

    session.run = counted  # type: ignore[method-assign]
    with Batcher(session, max_batch=8, max_wait_us=200, workers=2, padding=PaddingPlan()) as batcher:
        def client() -> None:
            for _ in range(20):
                batcher.run({"x": np.ones((1, 3), np.float32)})

        threads = [threading.Thread(target=client) for _ in range(12)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
    assert most[0] == 1 and max(session.calls) > 1 and sum(session.calls) == 240


def test_a_request_not_worth_stacking_runs_on_the_callers_thread_when_nothing_waits() -> None:
    session = FakeSession()
    names: list[str] = []
    plain = session.run

    def named(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        names.append(threading.current_thread().name)
        return plain(feeds)

    session.run = named  # type: ignore[method-assign]
    one_by_one = PaddingPlan({((3,),): [(1, 1.0)]}, 1.0, {((3,),): [(1, 10.0)]})  # 8 stacked: 80 us against 8 x 1
    seen: list[Any] = []
    with Batcher(session, max_batch=8, max_wait_us=0, workers=1, padding=one_by_one, on_batch=seen.append) as batcher:
        result = batcher.run({"x": np.full((1, 3), 3.0, np.float32)})
        queued = batcher.submit({"x": np.ones((1, 3), np.float32)}).result(10)
    np.testing.assert_array_equal(result["y"], np.full((1, 3), 6.0, np.float32))
    np.testing.assert_array_equal(queued["y"], np.full((1, 3), 2.0, np.float32))
    assert names == [threading.current_thread().name, "rlopt-batcher-0"], "run: inline; submit: a worker"
    assert [stats.requests for stats in seen] == [1, 1], "both counted in the metrics"
    stacking = Batcher(FakeSession(), max_batch=8, max_wait_us=0, workers=1, padding=PaddingPlan())
    with stacking:
        assert stacking.run({"x": np.ones((1, 3), np.float32)})["rows"].tolist() == [1]


def test_a_lone_request_worth_stacking_runs_on_the_callers_thread_and_the_next_ones_gather_meanwhile() -> None:
    session = FakeSession()
    seen: list[tuple[str, int]] = []
    started, release = threading.Event(), threading.Event()
    plain = session.run

    def gated(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        seen.append((threading.current_thread().name, int(feeds["x"].shape[0])))
        if len(seen) == 1:
            started.set()
            release.wait(10)
        return plain(feeds)

    session.run = gated  # type: ignore[method-assign]
    with Batcher(session, max_batch=8, max_wait_us=0, workers=2, padding=PaddingPlan()) as batcher:
        answers: list[dict[str, np.ndarray]] = []
        caller = threading.Thread(target=lambda: answers.append(batcher.run({"x": np.ones((1, 3), np.float32)})),
                                  name="the-caller")
        caller.start()
        assert started.wait(10)
        queued = [batcher.submit({"x": np.full((1, 3), float(k), np.float32)}) for k in range(3)]
        threading.Event().wait(0.05)
        assert len(seen) == 1, "no second run beside the caller's: the others gather"
        release.set()
        caller.join(10)
        results = [future.result(10) for future in queued]
    assert seen == [("the-caller", 1), ("rlopt-batcher-0", 3)] or seen == [("the-caller", 1), ("rlopt-batcher-1", 3)]
    np.testing.assert_array_equal(answers[0]["y"], np.full((1, 3), 2.0, np.float32))
    assert [r["y"][0, 0] for r in results] == [0.0, 2.0, 4.0]


def test_callers_of_a_bucket_not_worth_stacking_run_at_once_on_their_own_threads_however_many() -> None:
    session = FakeSession()
    inside: list[str] = []
    all_in, release = threading.Event(), threading.Event()
    plain = session.run

    def gated(feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        inside.append(threading.current_thread().name)
        if len(inside) == 4:
            all_in.set()
        release.wait(10)
        return plain(feeds)

    session.run = gated  # type: ignore[method-assign]
    one_by_one = PaddingPlan({((3,),): [(1, 1.0)]}, 1.0, {((3,),): [(1, 10.0)]})
    with Batcher(session, max_batch=8, max_wait_us=0, workers=2, padding=one_by_one) as batcher:
        callers = [threading.Thread(target=batcher.run, args=({"x": np.ones((1, 3), np.float32)},),
                                    name=f"caller-{k}") for k in range(4)]
        for caller in callers:
            caller.start()
        assert all_in.wait(10), f"4 callers, 2 workers: {inside} ran at once"
        release.set()
        for caller in callers:
            caller.join(10)
    assert sorted(inside) == [f"caller-{k}" for k in range(4)]


def test_feeds_checked_once_per_signature_are_still_refused_when_they_change() -> None:
    with Batcher(FakeSession(), max_batch=8, max_wait_us=0, workers=1, padding=PaddingPlan()) as batcher:
        good = np.ones((1, 3), np.float32)
        for _ in range(2):
            np.testing.assert_array_equal(batcher.run({"x": good})["y"], 2 * good)
        with pytest.raises(ValueError, match="input 'x': dtype <f8"):
            batcher.run({"x": good.astype(np.float64)})
        with pytest.raises(ValueError, match="dim 1 is 4"):
            batcher.run({"x": np.ones((1, 4), np.float32)})
        with pytest.raises(ValueError, match="do not match"):
            batcher.run({"x": good, "extra": good})
        strided = np.ones((3, 2), np.float32).T[:1]  # (1, 3), not C-contiguous
        np.testing.assert_array_equal(batcher.run({"x": strided})["y"], 2 * np.ones((1, 3), np.float32))


def test_a_new_plan_decides_stacking_from_then_on() -> None:
    """`rlopt serve --watch` sets a reloaded manifest's plan: which buckets stack follows it."""
    one_by_one = PaddingPlan({((3,),): [(1, 1.0)]}, 1.0, {((3,),): [(1, 10.0)]})
    with Batcher(FakeSession(), max_batch=8, max_wait_us=0, workers=1, padding=one_by_one) as batcher:
        assert batcher.scheduler.cap(((3,),)) == 1
        batcher.padding = PaddingPlan()
        assert batcher.scheduler.cap(((3,),)) == 8 and batcher.padding == PaddingPlan()
