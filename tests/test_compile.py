"""compile -> MODEL_DIR -> verify -> load, in process and through the real CLI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.errors import ArtifactError
from rlopt.manifest import MANIFEST_NAME, read_manifest
from rlopt.verify import verify_model_dir
from tests.conftest import (assert_one_line_error, assert_tensorrt_as_this_machine_allows, run_rlopt, tensorrt_missing,
                            write_tiny_recipe)

CPU_BACKENDS = ("torchscript", "onnxruntime", "tvm")


def test_manifest_layout(tiny_compiled: Path) -> None:
    manifest = read_manifest(tiny_compiled)
    assert manifest.schema_version == 2 and manifest.name == "tiny-heads" and len(manifest.recipe_sha256) == 64
    assert manifest.versions["torch"] and manifest.versions["onnx"] and manifest.versions["apache-tvm"]
    assert (tiny_compiled / "recipe.yaml").is_file()
    policy = manifest.networks["policy"]
    assert policy.inputs["input0"].min == [1, 1, 32] and policy.outputs == ["logits"]
    assert policy.artifacts["torchscript"].path == "policy/model.ts"
    assert policy.artifacts["onnxruntime"].path == "policy/model.onnx"
    assert policy.artifacts["tvm"].path == "policy/tvm-llvm.so"
    assert_tensorrt_as_this_machine_allows(policy.artifacts["tensorrt"])
    for backend in CPU_BACKENDS:
        record = policy.artifacts[backend]
        assert record.verified and record.parity.compared == 12
        assert record.parity.kl is not None and record.parity.argmax_agree == 1.0
        assert set(record.latency_us) == {"min", "opt", "max"}
        assert all(lat.p50 > 0 and lat.p99 >= lat.p50 for lat in record.latency_us.values())
    assert policy.selected in CPU_BACKENDS + (("tensorrt",) if tensorrt_missing() is None else ())
    assert policy.artifacts["tvm"].facts.as_dict()["fused_kernels"]
    assert manifest.networks["value"].artifacts["onnxruntime"].parity.kl is None
    assert not list(tiny_compiled.parent.glob(".*partial*")), "no staging directory left behind"


def test_load_every_backend_and_auto(tiny_compiled: Path) -> None:
    rng = np.random.default_rng(1)
    x = rng.standard_normal((3, 4, 32)).astype(np.float32)
    outputs = {}
    for backend in CPU_BACKENDS:
        with rlopt.load(tiny_compiled, "policy", backend=backend) as session:
            outputs[backend] = session.run({"input0": x})["logits"]
    for backend in CPU_BACKENDS:
        np.testing.assert_allclose(outputs[backend], outputs["torchscript"], atol=1e-5)
    session = rlopt.load(tiny_compiled, "policy")
    assert session.backend == read_manifest(tiny_compiled).networks["policy"].selected
    single = session.run({"input0": x[:1, :1]})["logits"]
    np.testing.assert_allclose(single, outputs["torchscript"][:1, :1], atol=1e-5)


def test_load_refuses_skipped_unknown_and_missing(tiny_compiled: Path) -> None:
    if tensorrt_missing() is not None:
        with pytest.raises(ArtifactError, match="skipped at compile time"):
            rlopt.load(tiny_compiled, "policy", backend="tensorrt")
    with pytest.raises(ArtifactError, match="no network 'critic'"):
        rlopt.load(tiny_compiled, "critic")
    with pytest.raises(rlopt.errors.UsageError, match="unknown"):
        rlopt.load(tiny_compiled, "policy", backend="tflite")
    with pytest.raises(ArtifactError, match="MODEL_DIR not found"):
        rlopt.load(tiny_compiled.parent / "absent", "policy")


def test_verify_passes_then_names_each_flipped_file(tiny_copy: Path) -> None:
    assert verify_model_dir(tiny_copy).passed
    targets = ["policy/model.ts", "policy/model.onnx", "policy/tvm-llvm.so", "value/reference.npz", "recipe.yaml"]
    for relative in targets:
        path = tiny_copy / relative
        original = path.read_bytes()
        data = bytearray(original)
        data[len(data) // 2] ^= 0x01
        path.write_bytes(bytes(data))
        report = verify_model_dir(tiny_copy)
        failed = [f for f in report.findings if not f.ok]
        assert not report.passed and failed, relative
        assert all(relative in f.detail or f.subject == relative for f in failed[:1]), (relative, failed)
        path.write_bytes(original)
    assert verify_model_dir(tiny_copy).passed


def test_verify_names_the_artifact_whose_backend_raises(tiny_compiled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A backend raising on the recorded inputs (TVM's dynamic library here) or refusing to open a file whose sha256
    matched is a failed verification naming the artifact, not an internal error (exit 3)."""
    from rlopt.backends.onnxruntime.runner import OnnxRuntimeRunner
    from rlopt.backends.tvm.runner import TvmRunner

    def raising(feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        raise RuntimeError("kernel crashed")

    monkeypatch.setattr(TvmRunner, "parity_variants", lambda self: {"dynamic": raising})
    monkeypatch.setattr(OnnxRuntimeRunner, "__init__", lambda self, *a, **k: (_ for _ in ()).throw(
        RuntimeError("no such provider")))
    report = verify_model_dir(tiny_compiled)
    failed = {(f.network, f.subject): f.detail for f in report.findings if not f.ok}
    assert failed[("policy", "tvm")] == "policy/tvm-llvm.so (dynamic): running the artifact raised RuntimeError: " \
        "kernel crashed"
    assert failed[("policy", "onnxruntime")] == "policy/model.onnx: opening it raised RuntimeError: no such provider"
    assert len(failed) == 4 and not report.passed, failed


def test_compile_fails_verification_naming_an_artifact_its_backend_cannot_open(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.onnxruntime.runner import OnnxRuntimeRunner
    from rlopt.compile.cache import StageCache

    monkeypatch.setattr(OnnxRuntimeRunner, "__init__", lambda self, *a, **k: (_ for _ in ()).throw(
        RuntimeError("no such provider")))
    from rlopt.compile import compile_recipe

    recipe = write_tiny_recipe(tmp_path, backends="[onnxruntime]")
    result = compile_recipe(recipe, tmp_path / "out", cache=StageCache(tmp_path / "cache", enabled=False))
    assert result.failures == [line for n in ("policy", "value") for line in (
        f"{n}/onnxruntime: {n}/model.onnx: opening it raised RuntimeError: no such provider",
        f"{n}: no backend was built and verified")]


def test_a_nan_weight_fails_compile_and_verify_saying_nan_and_naming_the_output(tmp_path: Path) -> None:
    """Contract section 7: a NaN in the reference fails, naming the output; verify says so too, not only 'FAIL'."""
    import torch

    from rlopt.compile import compile_recipe
    from tests.refit.conftest import tiny_model

    recipe = write_tiny_recipe(tmp_path, backends="[onnxruntime]")
    state = tiny_model(tmp_path).state_dict()
    state["policy.fc1.weight"][0, 0] = float("nan")
    torch.save(state, tmp_path / "nan.pt")
    recipe.write_text(recipe.read_text().replace("  seed: 3\n", "  checkpoint: nan.pt\n"))
    result = compile_recipe(recipe, tmp_path / "out")
    nan = "parity failed: PyTorch's output 'logits' holds NaN at (0, 0, 0, 0) (min, first index = sample)"
    assert f"policy/onnxruntime: {nan}: nothing to compare against" in result.failures, result.failures
    proc = run_rlopt("verify", str(tmp_path / "out"))
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert "policy/onnxruntime: parity FAILED: PyTorch's output 'logits' holds NaN at" in proc.stderr, proc.stderr


def test_verify_says_nan_where_a_backend_gives_nan(tiny_compiled: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends.onnxruntime.runner import OnnxRuntimeRunner

    infer = OnnxRuntimeRunner.infer

    def with_nan(self: OnnxRuntimeRunner, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        outputs = [np.array(o, copy=True) for o in infer(self, feeds)]
        outputs[0].flat[0] = np.nan
        return outputs

    monkeypatch.setattr(OnnxRuntimeRunner, "infer", with_nan)
    failed = {(f.network, f.subject): f.detail for f in verify_model_dir(tiny_compiled).findings if not f.ok}
    assert failed[("value", "onnxruntime")].startswith(
        "parity FAILED: output 'value' is NaN at (0, 0, 0, 0) where PyTorch gives a number"), failed


def test_flipped_artifact_is_never_loaded(tiny_copy: Path) -> None:
    path = tiny_copy / "policy" / "tvm-llvm.so"
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ArtifactError, match="sha256"):
        rlopt.load(tiny_copy, "policy", backend="tvm")


def test_manifest_tampering_is_caught(tiny_copy: Path) -> None:
    path = tiny_copy / MANIFEST_NAME
    document = json.loads(path.read_text())
    document["networks"]["policy"]["selected"] = "tvm" if document["networks"]["policy"]["selected"] != "tvm" else "onnxruntime"
    path.write_text(json.dumps(document))
    with pytest.raises(ArtifactError, match="content_sha256"):
        read_manifest(tiny_copy)
    document["schema_version"] = 99
    path.write_text(json.dumps(document))
    with pytest.raises(ArtifactError, match="schema_version"):
        read_manifest(tiny_copy)


def test_manifest_path_escaping_model_dir_is_refused(tiny_copy: Path) -> None:
    from rlopt.manifest import Manifest, write_json

    manifest = read_manifest(tiny_copy)
    manifest.networks["policy"].artifacts["tvm"].path = "../../x.so"
    write_json(tiny_copy / MANIFEST_NAME, manifest.seal().model_dump(mode="json"))
    assert isinstance(manifest, Manifest)
    with pytest.raises(ArtifactError, match="outside MODEL_DIR"):
        rlopt.load(tiny_copy, "policy", backend="tvm")


def test_cli_verify_exits_1_naming_the_flipped_file(tiny_copy: Path) -> None:
    ok = run_rlopt("verify", str(tiny_copy), "--json")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["passed"] is True
    path = tiny_copy / "value" / "model.onnx"
    data = bytearray(path.read_bytes())
    data[-10] ^= 0x01
    path.write_bytes(bytes(data))
    bad = run_rlopt("verify", str(tiny_copy))
    assert bad.returncode == 1 and "Traceback" not in bad.stderr
    assert "value/model.onnx" in bad.stderr


def test_fresh_process_loads_every_cpu_backend(tiny_compiled: Path) -> None:
    script = (
        "import sys, numpy as np, rlopt\n"
        "for b in ('torchscript', 'onnxruntime', 'tvm'):\n"
        "    s = rlopt.load(sys.argv[1], 'value', backend=b)\n"
        "    out = s.run({'input0': np.ones((2, 3, 32), np.float32)})['value']\n"
        "    print(b, out.shape, float(out.sum()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script, str(tiny_compiled)], capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    lines = proc.stdout.strip().splitlines()
    sums = [float(line.split()[-1]) for line in lines]
    assert len(lines) == 3 and all("(2, 3, 1)" in line for line in lines)
    assert max(sums) - min(sums) < 1e-4


def test_cli_compile_json_and_parity_failure_exits_1(tmp_path: Path) -> None:
    """At atol, rtol and max_kl 0 only a bit-exact backend passes: TorchScript, not ONNX Runtime (its GEMMs sum in
    another order, ~5e-8 apart on this model)."""
    recipe = write_tiny_recipe(tmp_path, backends="[torchscript, onnxruntime]")
    text = recipe.read_text().replace("verify:\n  samples: 4", "verify:\n  samples: 2\n  atol: 0.0\n  rtol: 0.0\n  max_kl: 0.0")
    recipe.write_text(text)
    proc = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "out"), "--json")
    assert proc.returncode == 1, proc.stderr
    document = json.loads(proc.stdout)
    assert document["passed"] is False and any("onnxruntime" in f for f in document["failures"])
    assert "verification failed" in proc.stderr and "atol to pass" in proc.stderr
    manifest = read_manifest(tmp_path / "out")
    assert manifest.networks["policy"].artifacts["torchscript"].verified, "bit-exact backend still passes at atol 0"
    assert not manifest.networks["policy"].artifacts["onnxruntime"].verified
    with pytest.raises(ArtifactError, match="failed verification"):
        rlopt.load(tmp_path / "out", "policy", backend="onnxruntime")


def test_cli_compile_refuses_non_model_dir_output(tmp_path: Path) -> None:
    recipe = write_tiny_recipe(tmp_path, backends="[onnxruntime]")
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "notes.txt").write_text("keep me")
    proc = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "precious"))
    assert_one_line_error(proc, 2, "precious", "not an rlopt MODEL_DIR", "fix:")
    assert (tmp_path / "precious" / "notes.txt").read_text() == "keep me"


def test_recompile_replaces_previous_model_dir(tmp_path: Path) -> None:
    from rlopt.compile import compile_recipe

    recipe = write_tiny_recipe(tmp_path, backends="[onnxruntime]")
    first = compile_recipe(recipe, tmp_path / "out").manifest.created_at
    second = compile_recipe(recipe, tmp_path / "out")
    assert second.passed and read_manifest(tmp_path / "out").created_at >= first
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_missing_artifact_is_named_by_verify_and_load(tiny_copy: Path) -> None:
    (tiny_copy / "policy" / "model.onnx").unlink()
    report = verify_model_dir(tiny_copy)
    assert not report.passed
    assert any("policy/model.onnx" in f.detail and "missing" in f.detail for f in report.findings if not f.ok)
    with pytest.raises(ArtifactError, match="missing"):
        rlopt.load(tiny_copy, "policy", backend="onnxruntime")
    assert rlopt.load(tiny_copy, "policy", backend="torchscript").backend == "torchscript"
