"""The TensorRT stand-in refuses what TensorRT refuses (issue 35, item 2), so the tests built on it can fail: a shape
outside every profile, profile ranges that are not min <= opt <= max, `set_input_shape` returning False, two threads
on one execution context, and builder flags read with TensorRT's state (TF32 on until cleared)."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest

from tests.tensorrt_models import build, plan_for
from tests.tensorrt_standin import make_tensorrt


@pytest.fixture()
def engine(tmp_path: Path):
    trt = make_tensorrt("11.4.0", busy_s=0.05)
    build(trt, plan_for("fp32", extra_profile=True, tmp=tmp_path), tmp_path)
    return trt, trt.Runtime(None).deserialize_cuda_engine((tmp_path / "model.plan").read_bytes())


def test_a_shape_outside_the_context_profile_is_refused(engine) -> None:
    _, built = engine
    context = built.create_execution_context()
    assert context.set_input_shape("obs", (8, 4)) is True  # profile 0: 1..8
    assert context.set_optimization_profile_async(1, 0) is True
    assert context.set_input_shape("obs", (8, 4)) is False  # profile 1: 1..2
    assert context.set_input_shape("obs", (2, 4, 1)) is False
    assert context.set_optimization_profile_async(2, 0) is False, "there is no profile 2"
    assert context.execute_async_v3(0) is False, "no shape set, no addresses: nothing runs"


def test_profiles_out_of_order_are_refused() -> None:
    trt = make_tensorrt("10.13.3")
    builder = trt.Builder(None)
    config, profile = builder.create_builder_config(), builder.create_optimization_profile()
    profile.set_shape("obs", (4, 4), (1, 4), (8, 4))
    assert config.add_optimization_profile(profile) == -1
    ordered = builder.create_optimization_profile()
    ordered.set_shape("obs", (1, 4), (4, 4), (8, 4))
    assert config.add_optimization_profile(ordered) == 0


def test_two_threads_on_one_execution_context_raise(engine) -> None:
    _, built = engine
    context = built.create_execution_context()
    feeds = np.ones((2, 4), np.float32)
    out = np.zeros((2, 6), np.float32)
    context.set_input_shape("obs", (2, 4))
    context.set_tensor_address("obs", feeds.ctypes.data)
    context.set_tensor_address("logits", out.ctypes.data)
    errors: list[BaseException] = []

    def execute() -> None:
        try:
            context.execute_async_v3(0)
        except RuntimeError as exc:
            errors.append(exc)

    threads = [threading.Thread(target=execute) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert len(errors) == 1 and "two threads" in str(errors[0])


def test_flags_read_as_tensorrt_sets_them_and_decide_what_the_engine_computes(tmp_path: Path) -> None:
    trt = make_tensorrt("11.4.0")
    config = trt.Builder(None).create_builder_config()
    assert config.get_flag(trt.BuilderFlag.TF32) is True, "TensorRT's default"
    assert config.get_flag(trt.BuilderFlag.REFIT) is False
    config.clear_flag(trt.BuilderFlag.TF32)
    assert config.get_flag(trt.BuilderFlag.TF32) is False
    with pytest.raises(AttributeError):
        trt.BuilderFlag.FP16  # gone in TensorRT 11
    build(trt, plan_for("fp32", tmp=tmp_path), tmp_path)
    assert trt.Runtime(None).deserialize_cuda_engine((tmp_path / "model.plan").read_bytes())._state["rounding"] is None
