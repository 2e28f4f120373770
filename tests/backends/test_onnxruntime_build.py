"""ONNX Runtime's compile check: a file it cannot open is that backend's build failure in one line, not exit 3."""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from rlopt.backends.onnxruntime.build import check_onnxruntime
from rlopt.errors import StageError
from rlopt.backends.onnxruntime.config import OnnxRuntimeConfig


def _model(path: Path, op_type: str) -> Path:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])
    graph = helper.make_graph([helper.make_node(op_type, ["x"], ["y"])], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_a_graph_onnx_runtime_opens_is_checked(tmp_path: Path) -> None:
    out = check_onnxruntime(_model(tmp_path / "model.onnx", "Relu"), OnnxRuntimeConfig())
    assert out.facts.providers == ["CPUExecutionProvider"] and out.facts.onnxruntime


def test_a_graph_onnx_runtime_cannot_open_is_a_one_line_build_failure(tmp_path: Path) -> None:
    model = _model(tmp_path / "model.onnx", "NoSuchOp")
    with pytest.raises(StageError) as raised:
        check_onnxruntime(model, OnnxRuntimeConfig())
    message = str(raised.value)
    assert "\n" not in message and message.startswith(f"{model}: ONNX Runtime cannot load it (")
    assert "NoSuchOp" in message and "fix: leave onnxruntime out" in message
