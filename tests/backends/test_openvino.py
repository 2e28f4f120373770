"""The OpenVINO backend with OpenVINO installed: the tiny recipe compiled with ONNX Runtime beside it, the IR and
its facts, the runner at every shape of the profile and from many threads, reduced precision, Triton, refit, and a
network with integer ids, a bool mask and recurrent state."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.errors import ArtifactError, BackendUnavailable
from rlopt.manifest import read_manifest, sha256_file
from rlopt.verify import verify_model_dir
from tests.conftest import CompileFactory, tiny_recipe_text

ov = pytest.importorskip("openvino")

RECIPE = tiny_recipe_text("[onnxruntime, openvino]").replace(
    "    outputs: [value]\n", "    outputs: [value]\n    precision: bf16\n")


@pytest.fixture(scope="module")
def model_dir(compiled: CompileFactory) -> Path:
    return compiled(RECIPE, name="tiny.yaml")


def _feeds(shape: tuple[int, ...], seed: int = 0) -> dict[str, np.ndarray]:
    return {"input0": np.random.default_rng(seed).standard_normal(shape).astype(np.float32)}


def test_every_backend_verifies_and_openvino_records_its_ir(model_dir: Path) -> None:
    manifest = read_manifest(model_dir)
    assert manifest.versions["openvino"] == ov.__version__.split("-")[0]
    for name in ("policy", "value"):
        network = manifest.networks[name]
        assert all(a.verified for a in network.artifacts.values()), name
        record = network.artifacts["openvino"]
        facts = record.facts.as_dict()
        assert record.path == f"{name}/model.xml" and facts["onnx"] == "model.onnx"
        assert facts["weights"]["path"] == f"{name}/model.bin"
        assert facts["weights"]["sha256"] == sha256_file(model_dir / name / "model.bin")
        assert facts["input_bounds"] == {"input0": [[1, 4], [1, 6], [32, 32]]}
        assert facts["threads_at_build"] >= 1 and facts["performance_hint"] == "LATENCY"
        stage = next(s for s in network.stages if s["stage"] == "openvino")
        assert stage["status"] == "ok"
    policy = manifest.networks["policy"].artifacts["openvino"].facts
    assert (policy.precision_built, policy.inference_precision) == ("fp32", "f32")


def test_a_reduced_precision_runs_where_the_cpu_has_it_else_fp32_with_a_notice(model_dir: Path) -> None:
    value = read_manifest(model_dir).networks["value"].artifacts["openvino"]
    if "BF16" in ov.Core().get_property("CPU", "OPTIMIZATION_CAPABILITIES"):
        assert (value.facts.precision_built, value.facts.inference_precision) == ("bf16", "bf16")
        assert value.facts.parity_gate is not None and "reduced_precision" in value.facts.parity_gate.why
    else:
        assert value.facts.precision_built == "fp32" and "lacks BF16" in (value.facts.notice or "")
    assert value.parity.passed


@pytest.mark.parametrize("shape", [(1, 1, 32), (2, 3, 32), (4, 6, 32), (3, 5, 32)], ids=str)
def test_the_ir_runs_every_shape_of_the_profile_like_onnx_runtime(model_dir: Path, shape: tuple[int, ...]) -> None:
    feeds = _feeds(shape)
    with rlopt.load(model_dir, "policy", "openvino") as vino, rlopt.load(model_dir, "policy", "onnxruntime") as ort:
        got, expected = vino.run(feeds)["logits"], ort.run(feeds)["logits"]
    assert got.shape == expected.shape == (*shape[:2], 5) and got.dtype == np.float32
    np.testing.assert_allclose(got, expected, atol=1e-5, rtol=1e-4)


def test_one_session_serves_many_threads_each_its_own_shapes(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.openvino import runner

    monkeypatch.setattr(runner, "COPY_MAX_BYTES", 500)  # 1x1x32 is copied into the request, the others shared
    shapes = [(1, 1, 32), (2, 3, 32), (4, 6, 32)]
    with rlopt.load(model_dir, "policy", "onnxruntime") as ort:
        expected = {shape: ort.run(_feeds(shape, 7))["logits"] for shape in shapes}
    errors: list[str] = []
    with rlopt.load(model_dir, "policy", "openvino") as session:
        def work(index: int) -> None:
            for step in range(60):  # the first calls check, the later ones take the thread's bound call
                shape = shapes[(index + step) % len(shapes)]
                got = session.run(_feeds(shape, 7))["logits"]
                if not np.allclose(got, expected[shape], atol=1e-5, rtol=1e-4):
                    errors.append(f"thread {index} step {step} {shape}")

        threads = [threading.Thread(target=work, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=60)
    assert not errors, errors[:5]


def test_read_only_inputs_are_copied_not_refused(model_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.openvino import runner

    feeds = _feeds((4, 6, 32), 3)
    feeds["input0"].flags.writeable = False  # OpenVINO cannot wrap it: it is copied on every path
    with rlopt.load(model_dir, "policy", "onnxruntime") as ort:
        expected = ort.run(feeds)["logits"]
    for copy_max in (0, 1 << 20):  # a bound call that wraps its inputs, one that copies them
        monkeypatch.setattr(runner, "COPY_MAX_BYTES", copy_max)
        with rlopt.load(model_dir, "policy", "openvino") as session:
            for _ in range(3):  # checked, then the thread's bound call
                np.testing.assert_allclose(session.run(feeds)["logits"], expected, atol=1e-5, rtol=1e-4)


def test_one_thread_facts_compute_on_one_thread_with_the_same_outputs(model_dir: Path) -> None:
    from rlopt.backends import BACKENDS, open_runner

    record = read_manifest(model_dir).networks["policy"].artifacts["openvino"]
    facts = BACKENDS["openvino"].one_thread(record.facts)
    assert facts.inference_num_threads == 1 and BACKENDS["openvino"].threads(facts) == 1
    feeds = _feeds((4, 6, 32))
    single = open_runner("openvino", model_dir / record.path, ["input0"], facts)
    default = open_runner("openvino", model_dir / record.path, ["input0"], record.facts)
    try:
        assert single._compiled.get_property("INFERENCE_NUM_THREADS") == 1
        np.testing.assert_allclose(single.infer(feeds)[0], default.infer(feeds)[0], atol=1e-6)
    finally:
        single.close()
        default.close()


def test_a_weights_file_that_differs_from_the_manifest_is_refused(model_dir: Path, tmp_path: Path) -> None:
    from tests.conftest import copy_model_dir

    damaged = copy_model_dir(model_dir, tmp_path)
    weights = damaged / "policy" / "model.bin"
    weights.write_bytes(weights.read_bytes()[:-4] + b"\0\0\0\0")
    with pytest.raises(ArtifactError, match=r"policy/model.bin: sha256: does not match manifest.json"):
        rlopt.load(damaged, "policy", "openvino")


def test_auto_runs_a_recorded_route_through_openvino_beside_onnx_runtime(model_dir: Path, tmp_path: Path) -> None:
    from tests.conftest import copy_model_dir
    from tests.refit.conftest import reseal

    mixed = copy_model_dir(model_dir, tmp_path)

    def route(document: dict) -> None:  # as if compile had measured OpenVINO fastest at the small shapes
        document["networks"]["policy"]["facts"]["route"] = {"routes": {
            "1x1x32": "openvino", "2x3x32": "openvino", "4x6x32": "onnxruntime", "other": "openvino"},
            "options": {"onnxruntime": {"allow_spinning": False}}}

    reseal(mixed, route)
    with rlopt.load(mixed, "policy") as session, rlopt.load(mixed, "policy", "onnxruntime") as ort:
        assert session.routes == {"1x1x32": "openvino", "2x3x32": "openvino", "4x6x32": "onnxruntime",
                                  "other": "openvino"} and session.backend == "openvino"
        for shape in [(1, 1, 32), (2, 3, 32), (4, 6, 32), (3, 5, 32)]:
            feeds = _feeds(shape, 5)
            for _ in range(2):
                np.testing.assert_allclose(session.run(feeds)["logits"], ort.run(feeds)["logits"], atol=1e-5, rtol=1e-4)


def test_without_openvino_auto_serves_from_the_others_and_openvino_says_why(model_dir: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.openvino import library

    monkeypatch.setitem(sys.modules, "openvino", None)
    monkeypatch.setattr(library, "_core", None)
    with rlopt.load(model_dir, "policy") as session:
        assert set(session.routes.values()) == {"onnxruntime"}
        assert session.run(_feeds((2, 3, 32)))["logits"].shape == (2, 3, 5)
    with pytest.raises(BackendUnavailable, match=r"backend 'openvino' cannot run here: .*pip install 'rlopt\[openvino\]'"):
        rlopt.load(model_dir, "policy", "openvino")


def test_triton_gets_the_ir_for_its_openvino_backend(model_dir: Path) -> None:
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    text_format = pytest.importorskip("google.protobuf.text_format")
    folder = model_dir / "triton" / "tiny-heads_policy_openvino"
    config = text_format.Parse((folder / "config.pbtxt").read_text(), model_config_pb2.ModelConfig())
    assert (config.backend, config.platform, config.max_batch_size) == ("openvino", "", 0)
    assert config.default_model_filename == "model.xml"
    assert [list(t.dims) for t in config.input] == [[-1, -1, 32]]
    assert [list(t.dims) for t in config.output] == [[-1, -1, 5]]
    assert {k: v.string_value for k, v in config.parameters.items()} == {"PERFORMANCE_HINT": "LATENCY",
                                                                          "NUM_STREAMS": "1"}
    assert sha256_file(folder / "1" / "model.bin") == sha256_file(model_dir / "policy" / "model.bin")
    files = read_manifest(model_dir).networks["policy"].files
    assert "triton/tiny-heads_policy_openvino/1/model.bin" in files


def _linear_onnx(path: Path, op: str = "MatMul") -> np.ndarray:
    """x[batch, 4] @ W + b as an ONNX file (`op` replaces MatMul, to make one no frontend converts); returns W."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(1).standard_normal((4, 3)).astype(np.float32)
    nodes = [helper.make_node(op, ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["y"])]
    graph = helper.make_graph(nodes, "linear", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 3])],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(np.ones(3, np.float32), "b")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return weight


def test_the_ir_comes_from_the_onnx_frontend_alone_with_the_profiles_bounds(tmp_path: Path,
                                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """ovc's `convert_model` adds graph passes that cost every conversion (so every refit) 150-250 ms and change no
    output: the frontend's graph, reshaped to the bounds, is what the CPU plugin compiles."""
    from rlopt.backends.openvino.convert import convert_ir
    from rlopt.backends.openvino.library import shared_core

    monkeypatch.setattr(ov, "convert_model", lambda *a, **k: pytest.fail("ovc's convert_model was called"))
    weight = _linear_onnx(tmp_path / "model.onnx")
    convert_ir(tmp_path / "model.onnx", tmp_path / "model.xml", {"x": [[1, 8], [4, 4]]})
    model = shared_core().read_model(str(tmp_path / "model.xml"))
    assert str(model.input(0).get_partial_shape()) == "[1..8,4]"
    x = np.arange(12, dtype=np.float32).reshape(3, 4)
    compiled = shared_core().compile_model(model, "CPU", {"INFERENCE_PRECISION_HINT": "f32"})  # bf16 where the CPU has it
    result = compiled.create_infer_request().infer({"x": x})
    np.testing.assert_allclose(next(iter(result.values())), x @ weight + 1.0, rtol=1e-5, atol=1e-5)


def test_an_op_the_frontend_cannot_convert_skips_the_backend_naming_it(tmp_path: Path) -> None:
    from rlopt.backends.openvino.convert import convert_ir

    _linear_onnx(tmp_path / "model.onnx", op="NoSuchOpAnywhere")
    with pytest.raises(BackendUnavailable, match=r"ONNX frontend cannot convert NoSuchOpAnywhere"):
        convert_ir(tmp_path / "model.onnx", tmp_path / "model.xml", {"x": [[1, 8], [4, 4]]})
    assert not (tmp_path / "model.xml").exists()


@pytest.mark.slow  # an extra OpenVINO compile; the all-backend compile above stays in the default run
def test_refit_converts_the_refitted_graph_again(model_dir: Path, tmp_path: Path) -> None:
    from tests.refit.conftest import perturbed_state, save_state, tiny_model

    folder = model_dir.parent
    state = perturbed_state(folder)
    out = rlopt.refit(model_dir, save_state(state, tmp_path / "new.pt"), tmp_path / "refitted")
    model = tiny_model(folder)
    model.load_state_dict(state)
    feeds = _feeds((3, 5, 32), 4)
    import torch

    with torch.no_grad():
        expected = model.policy(torch.from_numpy(feeds["input0"])).numpy()
    with rlopt.load(out, "policy", "openvino") as session:
        np.testing.assert_allclose(session.run(feeds)["logits"], expected, atol=1e-5, rtol=1e-4)
    old, new = read_manifest(model_dir).networks["policy"], read_manifest(out).networks["policy"]
    weights = new.artifacts["openvino"].facts.as_dict()["weights"]
    assert weights["sha256"] != old.artifacts["openvino"].facts.as_dict()["weights"]["sha256"]
    assert weights["sha256"] == sha256_file(out / "policy" / "model.bin")
    copy = "triton/tiny-heads_policy_openvino/1/model.bin"
    assert new.files[copy].sha256 == weights["sha256"] == sha256_file(out / copy), "Triton's copy follows the refit"
    assert verify_model_dir(out).passed


IDS_MASK_GRU = """\
import torch
from torch import nn


class IdsMaskGru(nn.Module):
    def __init__(self, vocab: int = 7, d: int = 8, hidden: int = 12, n_actions: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.cell = nn.GRUCell(d, hidden)
        self.head = nn.Linear(hidden, n_actions)

    def forward(self, ids: torch.Tensor, mask: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h_new = self.cell(self.embed(ids), h)
        return self.head(h_new).masked_fill(~mask, -1e9), h_new
"""

IDS_MASK_GRU_RECIPE = """\
name: ids-mask-gru
model: {factory: models/ids_mask_gru.py:IdsMaskGru, seed: 2}
networks:
  actor:
    module: ""
    kind: policy
    inputs:
      ids: {dtype: int64, range: [0, 6], min: [1], opt: [2], max: [4]}
      mask: {dtype: bool, min: [1, 4], opt: [2, 4], max: [4, 4]}
      h: {dtype: float32, min: [1, 12], opt: [2, 12], max: [4, 12]}
    outputs: [logits, h_new]
    state: {h: h_new}
backends: [onnxruntime, openvino]
verify: {samples: 2, steps: 3}
"""


@pytest.mark.slow  # an extra OpenVINO compile; the all-backend compile above stays in the default run
def test_integer_ids_a_bool_mask_and_recurrent_state_verify_over_steps(compiled: CompileFactory) -> None:
    out = compiled(IDS_MASK_GRU_RECIPE, name="ids.yaml", files={"models/ids_mask_gru.py": IDS_MASK_GRU})
    network = read_manifest(out).networks["actor"]
    record = network.artifacts["openvino"]
    assert record.verified and record.parity.compared == 3 * 2 * 3  # points x samples x steps, state fed back
    feeds = {"ids": np.array([0, 6, 3], np.int64), "mask": np.array([[True, False, True, True]] * 3),
             "h": np.zeros((3, 12), np.float32)}
    with rlopt.load(out, "actor", "openvino") as vino, rlopt.load(out, "actor", "onnxruntime") as ort:
        got, expected = vino.run(feeds), ort.run(feeds)
        bound = vino.run(feeds)  # the second call takes the bound call: int64 and bool tensors allocated once
    for name in ("logits", "h_new"):
        np.testing.assert_array_equal(bound[name], got[name])
    assert got["logits"].dtype == np.float32 and (got["logits"][:, 1] < -1e8).all()
    for name in ("logits", "h_new"):
        np.testing.assert_allclose(got[name], expected[name], atol=1e-5, rtol=1e-4)
