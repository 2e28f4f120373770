"""The TensorRT runner against the stand-in engine (tests/tensorrt_standin.py) and a torch whose CUDA device is the CPU
(tests/cuda_standin.py): profiles chosen by shape, one execution context per in-flight call, buffers allocated once,
pinned host buffers, return values checked, and an fp32 engine that is fp32."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from rlopt.backends.tensorrt.runner import TensorRTRunner, narrowest_profile
from rlopt.errors import ArtifactError, BackendUnavailable
from tests.cuda_standin import make_cuda_torch
from tests.tensorrt_models import build, calls_of, mlp_model, plan_for
from tests.tensorrt_standin import make_tensorrt


def _opened(tmp_path: Path, *, version: str = "11.4.0", extra_profile: bool = True, tf32: bool = False,
            width: int = 4, hidden: int = 8, **standin: object) -> tuple[TensorRTRunner, object, object]:
    trt = make_tensorrt(version, **standin)
    build(trt, plan_for("fp32", extra_profile=extra_profile, tf32=tf32, width=width, hidden=hidden, tmp=tmp_path),
          tmp_path, width=width, hidden=hidden)
    torch = make_cuda_torch()
    return TensorRTRunner(tmp_path / "model.plan", ["obs"], {}, trt=trt, torch=torch), trt, torch


def _expected(x: np.ndarray, width: int = 4, hidden: int = 8) -> np.ndarray:
    import onnxruntime as ort

    return ort.InferenceSession(mlp_model(hidden, width).SerializeToString()).run(None, {"obs": x})[0]


def test_the_narrowest_profile_holding_the_shapes_is_chosen() -> None:
    profiles = [{"obs": ((1, 4), (4, 4), (8, 4))}, {"obs": ((1, 4), (1, 4), (2, 4))}]
    assert narrowest_profile(profiles, {"obs": (2, 4)}) == 1
    assert narrowest_profile(profiles, {"obs": (3, 4)}) == 0
    assert narrowest_profile(profiles, {"obs": (9, 4)}) is None
    assert narrowest_profile(profiles, {"obs": (2, 4, 1)}) is None


def test_each_call_runs_in_the_profile_its_shape_falls_in(tmp_path: Path) -> None:
    runner, trt, _ = _opened(tmp_path)
    x = np.random.default_rng(0).standard_normal((8, 4)).astype(np.float32)
    calls_before = len(calls_of(trt, "IExecutionContext.set_input_shape"))
    small, big = runner.infer({"obs": x[:2]})[0], runner.infer({"obs": x})[0]
    served = [args[2] for args in calls_of(trt, "IExecutionContext.set_input_shape")[calls_before:]]
    assert served == [1, 0]
    np.testing.assert_allclose(small, _expected(x[:2]), atol=1e-5)
    np.testing.assert_allclose(big, _expected(x), atol=1e-5)
    runner.close()


def test_a_shape_outside_every_profile_is_a_value_error(tmp_path: Path) -> None:
    runner, trt, _ = _opened(tmp_path)
    with pytest.raises(ValueError, match="outside every optimization profile"):
        runner.infer({"obs": np.zeros((9, 4), np.float32)})
    assert calls_of(trt, "IExecutionContext.execute_async_v3") == []


def test_a_refused_input_shape_stops_the_call(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """set_input_shape returns False for a shape TensorRT will not take: the call raises, nothing executes."""
    runner, trt, _ = _opened(tmp_path)
    monkeypatch.setattr(trt.IExecutionContext, "set_input_shape", lambda self, name, shape: False)
    with pytest.raises(ValueError, match="TensorRT refused input 'obs' of shape \\[3, 4\\]"):
        runner.infer({"obs": np.zeros((3, 4), np.float32)})
    assert calls_of(trt, "IExecutionContext.execute_async_v3") == []


def test_concurrent_calls_each_get_an_execution_context_of_their_own(tmp_path: Path) -> None:
    """The stand-in raises when two threads use one context at once; eight threads calling together must not."""
    runner, _, _ = _opened(tmp_path)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((int(rng.integers(1, 9)), 4)).astype(np.float32) for _ in range(8)]
    expected = [_expected(x) for x in inputs]
    errors: list[BaseException] = []
    start = threading.Barrier(len(inputs))

    def worker(index: int) -> None:
        start.wait()
        try:
            for _ in range(10):
                np.testing.assert_allclose(runner.infer({"obs": inputs[index]})[0], expected[index], atol=1e-5)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert 2 <= sum(pool.made for pool in runner.pools) <= len(inputs) + 1
    runner.close()


def test_buffers_are_allocated_once_per_slot_and_host_buffers_are_pinned(tmp_path: Path) -> None:
    runner, _, torch = _opened(tmp_path)
    opened = list(torch._allocations)
    assert sorted((where, pinned) for where, pinned, _ in opened) == [("cpu", True)] * 4 + [("cuda", False)] * 4
    assert {count for where, _, count in opened} == {8 * 4, 8 * 6, 2 * 4, 2 * 6}  # each profile's max shapes
    for batch in (1, 2, 5, 8, 2, 1):
        runner.infer({"obs": np.ones((batch, 4), np.float32)})
    assert torch._allocations == opened, "no allocation per call"
    runner.close()


@pytest.mark.parametrize("tf32", [False, True])
def test_an_fp32_engine_at_hidden_768_passes_the_fp32_gate_only_without_tf32(tmp_path: Path, tf32: bool) -> None:
    """The recipe's fp32 tolerances (atol 1e-4, rtol 1e-3) against ONNX Runtime's fp32 at 768 wide: TF32's 10-bit
    mantissas miss them; the engine rlopt builds by default (TF32 cleared) meets them."""
    runner, _, _ = _opened(tmp_path, extra_profile=False, tf32=tf32, width=768, hidden=768)
    x = np.random.default_rng(2).standard_normal((8, 768)).astype(np.float32)
    got, expected = runner.infer({"obs": x})[0], _expected(x, 768, 768)
    within = np.abs(got - expected) <= 1e-4 + 1e-3 * np.abs(expected)
    assert within.all() != tf32
    runner.close()


def test_runner_refuses_an_engine_it_cannot_deserialize(tmp_path: Path) -> None:
    plan_file = tmp_path / "model.plan"
    plan_file.write_bytes(b"garbage")
    with pytest.raises(ArtifactError, match="cannot deserialize"):
        TensorRTRunner(plan_file, ["obs"], {}, trt=make_tensorrt("10.13.3"), torch=make_cuda_torch())


def test_an_engine_of_another_major_is_refused(tmp_path: Path) -> None:
    build(make_tensorrt("10.13.3"), plan_for("fp32", tmp=tmp_path), tmp_path)
    with pytest.raises(ArtifactError, match="another TensorRT version"):
        TensorRTRunner(tmp_path / "model.plan", ["obs"], {}, trt=make_tensorrt("11.4.0"), torch=make_cuda_torch())


def test_cuda_that_cannot_start_is_a_skip(tmp_path: Path) -> None:
    build(make_tensorrt("11.4.0"), plan_for("fp32", tmp=tmp_path), tmp_path)
    with pytest.raises(BackendUnavailable, match="could not create its runtime"):
        TensorRTRunner(tmp_path / "model.plan", ["obs"], {}, trt=make_tensorrt("11.4.0", cuda_fails=True),
                       torch=make_cuda_torch())


def test_runner_gate_without_gpu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("rlopt.backends.tensorrt.gate.gpu_absent_reason", lambda: "no NVIDIA GPU (test)")
    with pytest.raises(BackendUnavailable, match="needs an NVIDIA GPU"):
        TensorRTRunner(tmp_path / "model.plan", ["obs"], {})
