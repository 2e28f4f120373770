"""The ONNX weight map by construction: renamed and transposed copies found, folded weights refused."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")

from rlopt.stages.weight_map import apply_weight_map, build_weight_map, map_problem, sentinel_state  # noqa: E402


class Plain(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(6, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.fc(x))


class Folded(torch.nn.Module):
    """Its weight reaches the graph only as 2 * W: no state_dict entry, reshaped or transposed, explains it."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.randn(4, 6))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ (self.w * 2.0).t()


def _export(module: torch.nn.Module, path: Path) -> onnx.ModelProto:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(module.eval(), (torch.ones(3, 2, 6),), str(path), dynamo=False, input_names=["x"],
                          output_names=["y"], dynamic_axes={"x": {0: "batch"}}, do_constant_folding=True)
    return onnx.load(str(path))


def _map(module: torch.nn.Module, tmp_path: Path) -> tuple[dict, Path]:
    plain = _export(module, tmp_path / "plain.onnx")
    marked = sentinel_state(module.state_dict())
    copy = type(module)()
    copy.load_state_dict(marked)
    sentinel = _export(copy, tmp_path / "sentinel.onnx")
    return build_weight_map(plain, sentinel, {k: v.numpy() for k, v in marked.items()}), tmp_path / "plain.onnx"


def test_map_rewrites_the_graph_to_the_new_weights(tmp_path: Path) -> None:
    import onnxruntime

    torch.manual_seed(0)
    module = Plain()
    weight_map, path = _map(module, tmp_path)
    assert map_problem(weight_map) is None
    assert {e["key"] for e in weight_map["entries"].values()} == {"fc.weight", "fc.bias"}
    new = {k: (v + 1.0).numpy() for k, v in module.state_dict().items()}
    assert apply_weight_map(path, weight_map, new) == len(weight_map["entries"])
    module.load_state_dict({k: torch.from_numpy(v) for k, v in new.items()})
    x = np.linspace(-1, 1, 5 * 2 * 6, dtype=np.float32).reshape(5, 2, 6)
    got = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"]).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, module(torch.from_numpy(x)).detach().numpy(), atol=1e-6)


def test_folded_weight_is_unexplained(tmp_path: Path) -> None:
    torch.manual_seed(0)
    weight_map, _ = _map(Folded(), tmp_path)
    assert weight_map["unexplained"], weight_map
    problem = map_problem(weight_map)
    assert problem is not None and "folded by the exporter" in problem
