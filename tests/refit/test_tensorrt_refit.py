"""TensorRT's refit hook against the stand-in (tests/tensorrt_standin.py), which refuses what TensorRT refuses.

The hook hands the refitted graph, prepared as the build prepared it, to `trt.OnnxParserRefitter`; the refit driver
then runs the refitted engine through the parity gate, so a refit that drops biases (a known REFIT bug) fails the
refit instead of shipping. The end-to-end tests compile a tiny MODEL_DIR with the stand-in as the installed TensorRT
(its engine computes the parsed graph in ONNX Runtime) and refit it.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.backends.base import RefitInputs
from rlopt.backends.tensorrt.facts import TensorRTFacts
from rlopt.errors import BackendUnavailable, StageError, VerificationError
from rlopt.manifest import read_manifest
from tests.conftest import write_tiny_recipe
from tests.refit.conftest import perturbed_state, save_state
from tests.tensorrt_models import build, calls_of, mlp_model, open_the_gate, plan_for
from tests.tensorrt_standin import make_tensorrt

REFITTABLE = "tensorrt: {refittable: true}\n"


@pytest.fixture(scope="module")
def trt_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny recipe with torchscript and a refittable TensorRT engine (the stand-in), compiled without the stage
    cache (a stand-in engine must never be a cache hit for a real compile)."""
    from rlopt.compile import compile_recipe
    from rlopt.compile.cache import StageCache

    folder = tmp_path_factory.mktemp("trt-refit")
    recipe = write_tiny_recipe(folder, backends="[torchscript, tensorrt]", extra=REFITTABLE)
    with pytest.MonkeyPatch.context() as patch:
        open_the_gate(patch, make_tensorrt("11.4.0", busy_s=0.0))
        result = compile_recipe(recipe, folder / "model", cache=StageCache(enabled=False))
    assert result.passed, result.failures
    return result.model_dir


def _refit(model_dir: Path, trt_dir: Path, tmp_path: Path, trt: object, monkeypatch: pytest.MonkeyPatch) -> Path:
    open_the_gate(monkeypatch, trt)
    checkpoint = save_state(perturbed_state(trt_dir.parent, scale=0.2), tmp_path / "new.pt")
    return rlopt.refit(model_dir, checkpoint)


def test_the_compiled_engine_is_verified_and_refittable(trt_dir: Path) -> None:
    for network in read_manifest(trt_dir).networks.values():
        record = network.artifacts["tensorrt"]
        assert record.verified and record.facts.as_dict()["refittable"] and record.facts.as_dict()["precision_built"] == "fp32"


def test_refit_sets_every_weight_through_the_onnx_parser_refitter(trt_dir: Path, tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(trt_dir, model_dir)
    trt = make_tensorrt("11.4.0", busy_s=0.0)
    before = (model_dir / "policy" / "model.plan").read_bytes()
    _refit(model_dir, trt_dir, tmp_path, trt, monkeypatch)
    assert calls_of(trt, "OnnxParserRefitter.refit_from_file") == [("model.trt.onnx",)] * 2
    manifest = read_manifest(model_dir)
    assert manifest.refit_of and (model_dir / "policy" / "model.plan").read_bytes() != before
    feeds = {"input0": np.random.default_rng(5).standard_normal((3, 4, 32)).astype(np.float32)}
    with rlopt.load(model_dir, "policy", backend="torchscript") as reference, \
            rlopt.load(model_dir, "policy", backend="tensorrt") as engine:
        np.testing.assert_allclose(engine.run(feeds)["logits"], reference.run(feeds)["logits"], atol=1e-4)


def test_a_refit_that_drops_biases_fails_the_gate_and_replaces_nothing(trt_dir: Path, tmp_path: Path,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    model_dir = tmp_path / "model"
    shutil.copytree(trt_dir, model_dir)
    manifest_before = (model_dir / "manifest.json").read_bytes()
    with pytest.raises(VerificationError, match="tensorrt.*parity failed.*nothing was replaced"):
        _refit(model_dir, trt_dir, tmp_path, make_tensorrt("11.4.0", busy_s=0.0, refit_drops_bias=True), monkeypatch)
    assert (model_dir / "manifest.json").read_bytes() == manifest_before


def _hook_inputs(folder: Path, onnx_path: Path, **facts: object) -> RefitInputs:
    base = {"refittable": True, "prepared": {"source": "model.onnx", "precision_in_graph": "fp32"}, **facts}
    return RefitInputs(folder, "model.plan", TensorRTFacts.of(base), onnx_path, None, {})


def test_an_engine_built_without_refit_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.tensorrt.refit import refit_artifact

    trt = make_tensorrt("10.13.0")
    build(trt, plan_for("fp32", refit=False, tmp=tmp_path), tmp_path)
    open_the_gate(monkeypatch, trt)
    with pytest.raises(StageError, match="tensorrt.refittable: the engine was built without the REFIT flag"):
        refit_artifact(_hook_inputs(tmp_path, tmp_path / "model.onnx", refittable=False))
    with pytest.raises(StageError, match="TensorRT will not refit this engine"):  # the facts say so, the engine not
        refit_artifact(_hook_inputs(tmp_path, tmp_path / "model.onnx"))


def test_a_weight_the_refitted_graph_lacks_is_refused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import onnx

    from rlopt.backends.tensorrt.refit import refit_artifact

    trt = make_tensorrt("11.4.0")
    build(trt, plan_for("fp32", tmp=tmp_path), tmp_path)
    renamed = mlp_model()
    for node in renamed.graph.node:
        node.input[:] = ["b1_renamed" if name == "b1" else name for name in node.input]
    next(init for init in renamed.graph.initializer if init.name == "b1").name = "b1_renamed"
    onnx.save(renamed, str(tmp_path / "refitted.onnx"))
    open_the_gate(monkeypatch, trt)
    with pytest.raises(StageError, match="weight 'b1' was not set from the refitted graph"):
        refit_artifact(_hook_inputs(tmp_path, tmp_path / "refitted.onnx"))


def test_no_gpu_imports_nothing_of_tensorrt(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.tensorrt.refit import refit_artifact

    monkeypatch.delitem(sys.modules, "tensorrt", raising=False)
    monkeypatch.setattr("rlopt.backends.tensorrt.gate.unavailable_reason", lambda: "no GPU here")
    with pytest.raises(BackendUnavailable, match="no GPU here"):
        refit_artifact(_hook_inputs(tmp_path, tmp_path / "model.onnx"))
    assert "tensorrt" not in sys.modules
