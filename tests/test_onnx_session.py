"""`make_session`: the one way rlopt opens an ONNX Runtime session."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from rlopt.onnx_session import make_session
from rlopt.errors import ArtifactError, BackendUnavailable

pytest.importorskip("onnxruntime")


def _model_bytes() -> bytes:
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper

    graph = helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "relu",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["n", 3])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["n", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return bytes(model.SerializeToString())


def test_a_session_runs_from_a_file_or_bytes_with_the_options_asked_for(tmp_path: Path) -> None:
    path = tmp_path / "relu.onnx"
    path.write_bytes(_model_bytes())
    x = np.array([[-1.0, 0.5, 2.0]], np.float32)
    for source in (path, _model_bytes()):
        session = make_session(source, threads=2, spinning=False)
        np.testing.assert_array_equal(session.run(None, {"x": x})[0], np.maximum(x, 0))
        options = session.get_session_options()
        assert options.intra_op_num_threads == 2
        assert options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
        assert session.get_providers() == ["CPUExecutionProvider"]
    with pytest.raises(RuntimeError, match="does not have configuration"):  # ONNX Runtime's default: it spins
        make_session(path).get_session_options().get_session_config_entry("session.intra_op.allow_spinning")


def test_a_corrupt_model_is_an_artifact_error_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "model.onnx"
    path.write_bytes(b"not an onnx model")
    with pytest.raises(ArtifactError, match=r"model\.onnx: ONNX Runtime cannot load it .*; fix: recompile MODEL_DIR"):
        make_session(path)


def test_a_provider_the_session_lacks_is_never_a_silent_cpu_fallback(tmp_path: Path) -> None:
    import onnxruntime as ort

    if "CUDAExecutionProvider" in ort.get_available_providers():
        pytest.skip("this onnxruntime has CUDA")
    with pytest.raises(BackendUnavailable, match=r"CUDAExecutionProvider.*requested"):
        make_session(_model_bytes(), providers=["CUDAExecutionProvider", "CPUExecutionProvider"])
