"""The ONNX Runtime runner's bound call: the Session's hot path straight into the session's C++ run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.test_onnx_session import _model_bytes

pytest.importorskip("onnxruntime")


def _runner(tmp_path: Path, providers: list[str] | None = None):  # type: ignore[no-untyped-def]
    from rlopt.backends.onnxruntime.runner import OnnxRuntimeRunner

    path = tmp_path / "relu.onnx"
    path.write_bytes(_model_bytes())
    return OnnxRuntimeRunner(path, ["x"], {"providers": providers or ["CPUExecutionProvider"]})


def test_the_bound_call_gives_what_infer_gives(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    x = np.array([[-1.0, 0.5, 2.0], [3.0, -4.0, 0.0]], dtype=np.float32)
    call = runner.bound_call((((2, 3), np.dtype(np.float32)),), ["action"])
    assert call is not None
    out = call({"x": x}, (x,))
    assert list(out) == ["action"] and np.array_equal(out["action"], np.maximum(x, 0))
    assert np.array_equal(out["action"], runner.infer({"x": x})[0])


def test_no_bound_call_where_a_provider_could_fall_back(tmp_path: Path) -> None:
    runner = _runner(tmp_path)
    runner._cpu_only = False  # as for a session with the CUDA or TensorRT provider (no GPU here to open one)
    assert runner.bound_call((((2, 3), np.dtype(np.float32)),), ["y"]) is None


def _threads(session) -> int:  # type: ignore[no-untyped-def]
    return int(session.get_session_options().intra_op_num_threads)


def test_shapes_given_other_threads_run_on_a_session_of_their_own(tmp_path: Path) -> None:
    from rlopt.backends.onnxruntime.runner import OnnxRuntimeRunner

    path = tmp_path / "relu.onnx"
    path.write_bytes(_model_bytes())
    runner = OnnxRuntimeRunner(path, ["x"], {"intra_op_threads": 1, "shape_threads": {"4x3": 0, "2x3": 1}})
    assert set(runner._by_shape) == {"4x3"}, "2x3 names the session's own count: no session of its own"
    pooled = runner._by_shape["4x3"]
    assert _threads(runner._session) == 1 and _threads(pooled) == 0
    for rows, session in ((2, runner._session), (4, pooled)):
        x = np.linspace(-1, 1, rows * 3, dtype=np.float32).reshape(rows, 3)
        call = runner.bound_call((((rows, 3), np.dtype(np.float32)),), ["y"])
        assert call is not None and call.__globals__["run"] == session._sess.run
        assert np.array_equal(call({"x": x}, (x,))["y"], np.maximum(x, 0))
        assert runner._session_for([x.shape]) is session and np.array_equal(runner.infer({"x": x})[0], np.maximum(x, 0))
    assert not OnnxRuntimeRunner(path, ["x"], {"intra_op_threads": 1})._by_shape
