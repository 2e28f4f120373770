"""The ONNX Runtime runner's bound call: the Session's hot path straight into the session's C++ run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from tests.backends.test_onnxruntime_session import _model_bytes

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
