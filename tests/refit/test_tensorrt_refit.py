"""TensorRT's refit hook, planned on CPU against a stand-in that refuses what the real Refitter refuses.

The stand-in engine holds named weights like a refittable engine from the ONNX parser; `Refitter` refuses an
engine built without REFIT, unknown names and weights of another element count or dtype, and
`refit_cuda_engine` fails while any weight is missing (TensorRT 10 / 11 semantics).
"""

from __future__ import annotations

import pickle
import sys
import types
from pathlib import Path

import numpy as np
import pytest

from rlopt.backends.base import RefitInputs
from rlopt.backends.tensorrt.facts import TensorRTFacts
from rlopt.errors import BackendUnavailable, StageError
from tests.tensorrt_standin import make_tensorrt


def standin(version: str = "10.13.0") -> types.ModuleType:
    trt = make_tensorrt(version)

    class Weights:
        def __init__(self, array: np.ndarray) -> None:
            if not array.flags["C_CONTIGUOUS"]:
                raise TypeError("Weights need a contiguous array")
            self.array = array

    class Engine:
        def __init__(self, refittable: bool, weights: dict[str, np.ndarray]) -> None:
            self.refittable, self.weights = refittable, weights

        def serialize(self) -> bytes:
            return b"ENGINE" + pickle.dumps((self.refittable, self.weights))

    class Runtime:
        def __init__(self, logger: object) -> None:
            pass

        def deserialize_cuda_engine(self, data: bytes) -> Engine | None:
            return Engine(*pickle.loads(data[6:])) if data.startswith(b"ENGINE") else None

    class Refitter:
        def __init__(self, engine: Engine, logger: object) -> None:
            if not engine.refittable:
                raise RuntimeError("engine is not refittable")
            self.engine, self.given = engine, {}

        def get_all_weights(self) -> list[str]:
            return list(self.engine.weights)

        def set_named_weights(self, name: str, weights: Weights) -> bool:
            old = self.engine.weights.get(name)
            if old is None or old.size != weights.array.size or old.dtype != weights.array.dtype:
                return False
            self.given[name] = weights.array.reshape(old.shape).copy()
            return True

        def get_missing_weights(self) -> list[str]:
            return [name for name in self.engine.weights if name not in self.given]

        def refit_cuda_engine(self) -> bool:
            if self.get_missing_weights():
                return False
            self.engine.weights.update(self.given)
            return True

    trt.Weights, trt.Runtime, trt.Refitter = Weights, Runtime, Refitter
    return trt


def _prepared(onnx_path: Path) -> dict[str, np.ndarray]:
    from rlopt.backends.tensorrt.refit import prepared_weights

    inputs = RefitInputs(onnx_path.parent, "model.plan", TensorRTFacts(), onnx_path, None, {})
    return prepared_weights(inputs, TensorRTFacts(prepared={"source": onnx_path.name, "precision_in_graph": "fp32"}))


@pytest.fixture()
def setup(base_dir: Path, tmp_path: Path) -> tuple[Path, Path, Path]:
    """An engine over the old graph's prepared weights, and a refitted model.onnx beside it."""
    import shutil

    import onnx

    from rlopt.manifest import read_manifest
    from rlopt.stages.weight_map import apply_weight_map, tensor_locations

    folder = tmp_path / "policy"
    shutil.copytree(base_dir / "policy", folder)
    old = _prepared(folder / "model.onnx")
    (folder / "model.plan").write_bytes(b"ENGINE" + pickle.dumps((True, old)))
    weight_map = read_manifest(base_dir).networks["policy"].facts.as_dict()["onnx"]["weight_map"]
    state = {}
    for location, entry in weight_map["entries"].items():
        if entry["transform"] == "identity":
            array = onnx.numpy_helper.to_array(tensor_locations(onnx.load(str(folder / "model.onnx")))[location])
            state[entry["key"]] = array + 1.0
    apply_weight_map(folder / "model.onnx", weight_map, state)
    return folder, folder / "model.onnx", folder / "model.plan"


def _inputs(folder: Path, onnx_path: Path, **facts: object) -> RefitInputs:
    base = {"refittable": True, "prepared": {"source": "model.onnx", "precision_in_graph": "fp32"}, **facts}
    return RefitInputs(folder, "model.plan", TensorRTFacts.of(base), onnx_path, None, {})


def _with_trt(monkeypatch: pytest.MonkeyPatch, trt: types.ModuleType) -> None:
    monkeypatch.setitem(sys.modules, "tensorrt", trt)
    monkeypatch.setattr("rlopt.backends.tensorrt.build.tensorrt_unavailable_reason", lambda: None)


@pytest.mark.parametrize("version", ["10.13.0", "11.4.0"])
def test_refit_writes_the_new_weights_by_name(setup: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch,
                                              version: str) -> None:
    from rlopt.backends.tensorrt.refit import refit_artifact

    folder, onnx_path, plan = setup
    old = pickle.loads(plan.read_bytes()[6:])[1]
    trt = standin(version)
    _with_trt(monkeypatch, trt)
    facts = refit_artifact(_inputs(folder, onnx_path))
    engine = trt.Runtime(None).deserialize_cuda_engine(plan.read_bytes())
    expected = _prepared(onnx_path)
    assert facts.refitted_weights == len(engine.weights) > 0
    for name, value in engine.weights.items():
        np.testing.assert_array_equal(value, expected[name])
    assert any(not np.array_equal(value, old[name]) for name, value in engine.weights.items())


def test_engine_built_without_refit_is_refused(setup: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.tensorrt.refit import refit_artifact

    folder, onnx_path, _ = setup
    _with_trt(monkeypatch, standin())
    with pytest.raises(StageError, match="tensorrt.refittable: the engine was built without the REFIT flag"):
        refit_artifact(_inputs(folder, onnx_path, refittable=False))


def test_engine_weight_the_graph_lacks_is_refused(setup: tuple[Path, Path, Path],
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.tensorrt.refit import refit_artifact

    folder, onnx_path, plan = setup
    refittable, weights = pickle.loads(plan.read_bytes()[6:])
    plan.write_bytes(b"ENGINE" + pickle.dumps((refittable, {**weights, "ghost": np.zeros(3, np.float32)})))
    _with_trt(monkeypatch, standin())
    with pytest.raises(StageError, match="weight 'ghost' is no initializer"):
        refit_artifact(_inputs(folder, onnx_path))


def test_no_gpu_imports_nothing_of_tensorrt(setup: tuple[Path, Path, Path], monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.tensorrt.refit import refit_artifact

    folder, onnx_path, _ = setup
    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    monkeypatch.setattr("rlopt.backends.tensorrt.build.tensorrt_unavailable_reason", lambda: "no GPU here")
    with pytest.raises(BackendUnavailable, match="no GPU here"):
        refit_artifact(_inputs(folder, onnx_path))
    assert "tensorrt" not in sys.modules
