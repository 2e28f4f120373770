"""The GPU path on a machine without a GPU: the issue's "done when" recipe (tests/data/gpu_path.yaml).

Hidden dims 1000 and 513 with pad_gemm 256: the padded ONNX holds 1024 and 768, matches the
unpadded model exactly at min/opt/max, TensorRT ends `skipped` with the reason, TVM for CUDA is
cross-compiled (or skipped without nvcc), and every Triton config parses with Triton's protobuf
and agrees with the profile. Plus the per-network precision pieces: int8 on CPU and fp16 casts.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from rlopt.errors import BackendUnavailable
from rlopt.manifest import read_manifest
from rlopt.parity import Tolerance
from rlopt.backends.tvm.config import TvmConfig
from rlopt.reference import Reference
from tests.conftest import CompileFactory, assert_tensorrt_as_this_machine_allows, tensorrt_missing

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "tests" / "data" / "gpu_path.yaml"
RLOPT = [sys.executable, "-m", "rlopt"]


def compile_recipe(out: Path, *backends: str) -> dict:
    flags = [arg for b in backends for arg in ("--backend", b)]
    done = subprocess.run([*RLOPT, "compile", str(RECIPE), "-o", str(out), "--json", *flags],
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout)


@pytest.fixture(scope="module")
def gpu_dir(compiled: CompileFactory) -> Path:
    """The recipe compiled once per session with the backends that take the padded ONNX (TVM's CUDA build is the slow
    test's; TorchScript's Triton files are tests/test_triton.py's); read-only."""
    return compiled(RECIPE, ["onnxruntime", "tensorrt"])


def initializer_dims(path: Path) -> set[int]:
    from rlopt.onnx_graph import subgraphs as _graphs

    model = onnx.load(str(path))
    return {d for g in _graphs(model.graph) for init in g.initializer for d in init.dims}


def test_padded_onnx_has_1024_and_768_where_1000_and_513_stood(gpu_dir: Path) -> None:
    for network in ("policy", "value"):
        before = initializer_dims(gpu_dir / network / "model.onnx")
        after = initializer_dims(gpu_dir / network / "model.padded.onnx")
        assert {1000, 513} <= before
        assert 1000 not in after and 1024 in after
    assert 513 not in initializer_dims(gpu_dir / "policy" / "model.padded.onnx")
    assert 768 in initializer_dims(gpu_dir / "policy" / "model.padded.onnx")
    # the value network's 513 feeds a LayerNorm: left alone, with the reason
    assert 513 in initializer_dims(gpu_dir / "value" / "model.padded.onnx")


def test_manifest_lists_padded_dims_skipped_edges_and_exactness(gpu_dir: Path) -> None:
    manifest = read_manifest(gpu_dir)
    policy = manifest.networks["policy"].facts.as_dict()["pad_gemm"]
    assert sorted({(p["from"], p["to"]) for p in policy["padded"]}) == [(513, 768), (1000, 1024)]
    assert policy["exactness"] == {"max_abs_diff": 0.0, "bit_identical": True, "compared": 12}
    value = manifest.networks["value"].facts.as_dict()["pad_gemm"]
    reasons = [s["reason"] for s in value["skipped"]]
    assert any("LayerNormalization" in r for r in reasons) and any("network output" in r for r in reasons)
    assert manifest.networks["policy"].artifacts["onnxruntime"].path == "policy/model.padded.onnx"
    assert "model.padded.onnx" in manifest.networks["policy"].files


def test_padded_model_matches_the_unpadded_one_at_min_opt_max(gpu_dir: Path) -> None:
    import onnxruntime as ort

    manifest = read_manifest(gpu_dir)
    for network, record in manifest.networks.items():
        reference = Reference.load(gpu_dir / record.reference.path, list(record.inputs), record.outputs)
        plain = ort.InferenceSession(str(gpu_dir / network / "model.onnx"))
        padded = ort.InferenceSession(str(gpu_dir / network / "model.padded.onnx"))
        for point in ("min", "opt", "max"):
            feeds = reference.feeds(point, 0)
            assert np.array_equal(plain.run(None, feeds)[0], padded.run(None, feeds)[0]), (network, point)


def test_tensorrt_is_skipped_with_the_reason_or_built_and_the_plan_is_recorded(gpu_dir: Path) -> None:
    manifest = read_manifest(gpu_dir)
    for network in manifest.networks.values():
        trt = network.artifacts["tensorrt"]
        assert_tensorrt_as_this_machine_allows(trt)
        assert network.facts.profiles[0]["obs"]["max"] == [8, 16, 64]
        assert trt.facts.profiles == network.facts.profiles, "TensorRT's plan, built or skipped"
    assert manifest.networks["value"].artifacts["tensorrt"].facts.precision == "fp16"
    assert len(list(gpu_dir.rglob("model.plan"))) == (0 if tensorrt_missing() else 2)


def test_precision_record_says_what_each_backend_did(gpu_dir: Path) -> None:
    value = read_manifest(gpu_dir).networks["value"].facts.as_dict()["precision"]
    assert value["requested"] == "fp16"
    assert "precision fp16 not applied" in value["backends"]["onnxruntime"]
    assert value["backends"]["tensorrt"].startswith("not built: TensorRT needs" if tensorrt_missing() else
                                                     "built in fp16")


def test_every_triton_config_parses_and_agrees_with_the_profile(gpu_dir: Path) -> None:
    model_config_pb2 = pytest.importorskip("tritonclient.grpc.model_config_pb2")
    from google.protobuf import text_format

    manifest = read_manifest(gpu_dir)
    configs = sorted((gpu_dir / "triton").glob("*/config.pbtxt"))
    built = ["onnxruntime"] + ([] if tensorrt_missing() else ["tensorrt"])
    assert [c.parent.name for c in configs] == sorted(f"gpu-path_{n}_{b}" for n in ("policy", "value") for b in built)
    for path in configs:
        config = text_format.Parse(path.read_text(), model_config_pb2.ModelConfig())
        network = manifest.networks[config.name.split("_")[1]]
        profile = network.facts.as_dict()["profiles"][0]["obs"]
        assert config.max_batch_size == profile["max"][0] == 8
        assert [list(t.dims) for t in config.input] == [[-1, 64]]
        assert [(w.batch_size, list(next(iter(w.inputs.values())).dims)) for w in config.model_warmup] == [
            (p[0], p[1:]) for p in (profile["min"], profile["opt"], profile["max"])]
        assert (path.parent / "1").iterdir()
    assert (gpu_dir / "triton/gpu-path_policy_onnxruntime/1/model.onnx").read_bytes() == \
        (gpu_dir / "policy/model.padded.onnx").read_bytes()


def test_verify_rehashes_triton_files_and_passes(gpu_dir: Path) -> None:
    """In process: `rlopt verify` itself (exit codes, JSON) is tests/test_compile.py's."""
    from rlopt.verify import verify_model_dir

    report = verify_model_dir(gpu_dir)
    assert report.passed, [f.detail for f in report.findings if not f.ok]
    rehashed = {f.subject for f in report.findings if f.detail == "sha256 ok"}
    assert {"triton/gpu-path_value_onnxruntime/1/model.onnx", "triton/gpu-path_policy_onnxruntime/1/model.onnx",
            "policy/model.padded.onnx"} <= rehashed
    built = ("onnxruntime",) + (() if tensorrt_missing() else ("tensorrt",))
    assert {(f.network, f.subject) for f in report.findings if f.detail.startswith("parity ok")} == {
        (n, b) for n in ("policy", "value") for b in built}


def tiny_mlp(path: Path, hidden: int = 40) -> Path:
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array((rng.standard_normal(s) / np.sqrt(s[0])).astype(np.float32), n)
             for n, s in (("w1", (8, hidden)), ("b1", (hidden,)), ("w2", (hidden, 3)))]  # nn.Linear-like scale
    nodes = [helper.make_node("MatMul", ["obs", "w1"], ["m"]), helper.make_node("Add", ["m", "b1"], ["a"]),
             helper.make_node("Relu", ["a"], ["r"]), helper.make_node("MatMul", ["r", "w2"], ["out"])]
    graph = helper.make_graph(nodes, "tiny", [helper.make_tensor_value_info("obs", TensorProto.FLOAT, ["batch", 8])],
                              [helper.make_tensor_value_info("out", TensorProto.FLOAT, ["batch", 3])], inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))
    return path


def test_tvm_cuda_is_cross_compiled_with_nvcc(tmp_path: Path) -> None:
    from rlopt.backends.tvm.cuda import build_tvm_cuda, find_nvcc

    if find_nvcc() is None:
        pytest.skip("nvcc not installed here")
    out = build_tvm_cuda(tiny_mlp(tmp_path / "m.onnx"), TvmConfig(target={"kind": "cuda", "arch": "sm_86"}), tmp_path,
                         precision="fp32", recipe_path=tmp_path / "r.yaml", network="policy")
    assert out.artifact == tmp_path / "tvm-cuda-sm_86.so" and out.artifact.stat().st_size > 0
    check = out.facts.cross_compile_check
    assert check["arch"] == "sm_86" and check["fatbin_bytes"] > 0
    assert any(k.startswith("fused_matmul") for k in out.facts.fused_kernels)


def test_tvm_cuda_without_nvcc_is_skipped_with_the_reason(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.tvm.cuda import build_tvm_cuda

    monkeypatch.setattr("rlopt.backends.tvm.cuda.find_nvcc", lambda: None)
    with pytest.raises(BackendUnavailable, match="needs nvcc"):
        build_tvm_cuda(tiny_mlp(tmp_path / "m.onnx"), TvmConfig(target={"kind": "cuda", "arch": "sm_86"}), tmp_path,
                       precision="fp32", recipe_path=tmp_path / "r.yaml", network="policy")


def tiny_reference(onnx_path: Path) -> Reference:
    import onnxruntime as ort

    session = ort.InferenceSession(str(onnx_path))
    rng = np.random.default_rng(2)
    arrays = {}
    for point, batch in (("min", 1), ("opt", 4), ("max", 8)):
        inputs = rng.standard_normal((8, batch, 8)).astype(np.float32)
        arrays[f"{point}:in:obs"] = inputs
        arrays[f"{point}:out:out"] = np.stack([session.run(None, {"obs": x})[0] for x in inputs])
    return Reference(arrays, ["obs"], ["out"])


def test_int8_is_kept_when_it_passes_its_gate_and_reports_cost_and_gain(tmp_path: Path) -> None:
    from rlopt.backends.onnxruntime.quantize import quantize_int8

    source = tiny_mlp(tmp_path / "m.onnx", hidden=256)
    out = quantize_int8(source, tmp_path / "model.int8.onnx", tiny_reference(source), kind="value",
                        distribution="categorical", gate=Tolerance(0.05, 0.05, 1e-3), recipe_path=tmp_path / "r.yaml",
                        network="value")
    assert out.artifact == tmp_path / "model.int8.onnx" and out.facts["precision_built"] == "int8"
    report = out.facts["int8"]
    assert report["kept"] and 0 < report["max_abs"] <= 0.05 + 0.05 * 10
    assert set(report["p50_us_at_opt"]) == {"fp32", "int8"} and report["speedup_at_opt"] > 0


def test_int8_failing_its_gate_falls_back_to_fp32_with_a_notice(tmp_path: Path) -> None:
    from rlopt.backends.onnxruntime.quantize import quantize_int8

    source = tiny_mlp(tmp_path / "m.onnx", hidden=256)
    out = quantize_int8(source, tmp_path / "model.int8.onnx", tiny_reference(source), kind="value",
                        distribution="categorical", gate=Tolerance(1e-7, 0.0, 1e-3), recipe_path=tmp_path / "r.yaml",
                        network="value")
    assert out.artifact == source and out.facts["precision_built"] == "fp32"
    assert out.facts["int8"]["kept"] is False and "int8 not kept" in out.facts["notice"]
    assert not (tmp_path / "model.int8.onnx").exists()


def test_fp16_casts_keep_fp32_inputs_and_outputs(tmp_path: Path) -> None:
    import onnxruntime as ort

    from rlopt.backends.tensorrt.prepare import prepare_for_tensorrt

    source = tiny_mlp(tmp_path / "m.onnx")
    out = prepare_for_tensorrt(source, tmp_path / "fp16.onnx", cast_to="fp16", recipe_path=tmp_path / "r.yaml",
                               network="value")
    model = onnx.load(str(out.artifact))
    assert {i.data_type for i in model.graph.initializer if i.dims} == {TensorProto.FLOAT16}
    assert model.graph.input[0].type.tensor_type.elem_type == TensorProto.FLOAT
    x = {"obs": np.random.default_rng(3).standard_normal((4, 8)).astype(np.float32)}
    full, half = (ort.InferenceSession(str(p)).run(None, x)[0] for p in (source, out.artifact))
    assert half.dtype == np.float32 and np.allclose(full, half, atol=2e-2, rtol=2e-2)


def test_prepare_refuses_onnx_runtime_only_ops(tmp_path: Path) -> None:
    from rlopt.errors import StageError
    from rlopt.backends.tensorrt.prepare import prepare_for_tensorrt

    source = tiny_mlp(tmp_path / "m.onnx")
    model = onnx.load(str(source))
    model.graph.node[2].domain = "com.microsoft"
    model.opset_import.append(helper.make_opsetid("com.microsoft", 1))
    onnx.save(model, str(source))
    with pytest.raises(StageError, match="com.microsoft::Relu"):
        prepare_for_tensorrt(source, tmp_path / "o.onnx", cast_to=None, recipe_path=tmp_path / "r.yaml",
                             network="value")


@pytest.mark.slow
def test_full_recipe_builds_tvm_cuda_unverified_here(tmp_path: Path) -> None:
    """All four backends, TVM for sm_86 included (minutes on 2 cores: nvcc and TVM per network)."""
    from rlopt.backends.tvm.cuda import find_nvcc

    compile_recipe(tmp_path / "out")
    manifest = read_manifest(tmp_path / "out")
    for name, network in manifest.networks.items():
        tvm = network.artifacts["tvm"]
        if find_nvcc() is None:
            assert tvm.skipped and "nvcc" in tvm.skipped
            continue
        assert tvm.built and tvm.path == f"{name}/tvm-cuda-sm_86.so"
        if _no_cuda_device() is None:  # a GPU machine verifies it
            assert tvm.verified, tvm
            continue
        assert tvm.facts.verified is False and "GPU" in (tvm.facts.not_verified or "")
        assert network.selected != "tvm"
    assert manifest.networks["value"].artifacts["tvm"].facts.as_dict().get("precision_built", "fp16") == "fp16"


def _no_cuda_device() -> str | None:
    from rlopt.machine import gpu_absent_reason

    return gpu_absent_reason()


@pytest.mark.gpu
@pytest.mark.skipif(_no_cuda_device() is not None, reason=str(_no_cuda_device()))
def test_tvm_cuda_library_runs_and_matches_onnxruntime(tmp_path: Path) -> None:
    """On a GPU machine: the cross-compiled library loads through rlopt's TVM runner and matches ONNX Runtime."""
    import onnxruntime as ort

    from rlopt.backends import open_runner
    from rlopt.backends.tvm.cuda import build_tvm_cuda

    source = tiny_mlp(tmp_path / "m.onnx")
    out = build_tvm_cuda(source, TvmConfig(target={"kind": "cuda", "arch": "sm_86"}), tmp_path, precision="fp32",
                         recipe_path=tmp_path / "r.yaml", network="policy")
    runner = open_runner("tvm", out.artifact, ["obs"], out.facts)
    feeds = {"obs": np.random.default_rng(4).standard_normal((5, 8)).astype(np.float32)}
    expected = ort.InferenceSession(str(source)).run(None, feeds)[0]
    got = runner.infer(feeds)[0]
    runner.close()
    assert np.allclose(got, expected, atol=1e-4, rtol=1e-3)
