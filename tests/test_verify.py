"""`rlopt verify` and `rlopt inspect` on GPU artifacts (contract sections 7 and 11): an artifact this machine cannot
check is "unverified here: <reason>", exit 0, exit 1 with `--strict`, never "ok"; inspect shows the GPU's identity."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from rlopt.errors import BackendUnavailable
from rlopt.verify import verify_model_dir
from tests.conftest import run_rlopt
from tests.refit.conftest import reseal

CUDA_REASON = "TorchScript on CUDA needs an NVIDIA GPU and a CUDA build of torch"
A10G = {"name": "NVIDIA A10G", "compute_capability": "8.6", "driver": "550.54.15", "cuda_runtime": "12.8",
        "tensorrt": None}


@pytest.fixture(scope="module")
def cuda_artifact_dir(tiny_compiled: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny MODEL_DIR with its torchscript artifacts recorded as built for CUDA (as on a GPU machine)."""
    target = tmp_path_factory.mktemp("verify") / "model"
    shutil.copytree(tiny_compiled, target)

    def on_cuda(document: dict) -> None:
        for network in document["networks"].values():
            network["artifacts"]["torchscript"]["facts"].update(device="cuda", cuda_graphs=True, gpu=A10G)

    reseal(target, on_cuda)
    return target


def _skip_if_cuda_runs_here() -> None:
    from rlopt.backends.torchscript.cuda.gate import unavailable_reason

    if unavailable_reason() is None:
        pytest.skip("this machine runs TorchScript on CUDA: nothing is unverified here")


def test_an_artifact_this_machine_cannot_run_is_unverified_not_ok(cuda_artifact_dir: Path) -> None:
    _skip_if_cuda_runs_here()
    report = verify_model_dir(cuda_artifact_dir)
    assert report.passed
    assert sorted((f.network, f.subject) for f in report.unverified) == [("policy", "torchscript"),
                                                                        ("value", "torchscript")]
    assert all(f.detail.startswith(f"unverified here: {CUDA_REASON}") for f in report.unverified)
    assert {f.subject for f in report.findings if f.detail.startswith("parity ok")} >= {"onnxruntime", "tvm"}


def test_the_cli_prints_unverified_here_and_fails_only_under_strict(cuda_artifact_dir: Path) -> None:
    _skip_if_cuda_runs_here()
    plain = run_rlopt("verify", str(cuda_artifact_dir))
    assert plain.returncode == 0, plain.stderr
    assert "unverified here: TorchScript on CUDA needs" in " ".join(plain.stdout.split())
    strict = run_rlopt("verify", str(cuda_artifact_dir), "--strict", "--json")
    assert strict.returncode == 1, strict.stderr
    document = json.loads(strict.stdout)
    assert document["strict"] is True and document["unverified"] == ["policy/torchscript", "value/torchscript"]
    assert strict.stderr.count("FAIL") == 2 and "unverified here" in strict.stderr and "Traceback" not in strict.stderr


def test_a_library_that_cannot_start_at_verify_time_is_unverified(tiny_copy: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The availability rule passed, yet opening the artifact found the library unable to start (CUDA, say)."""
    from rlopt import verify

    real = verify.open_artifact

    def fails_for_onnxruntime(model_dir, backend, *args, **kwargs):
        if backend == "onnxruntime":
            raise BackendUnavailable("CUDA did not start (test)")
        return real(model_dir, backend, *args, **kwargs)

    monkeypatch.setattr(verify, "open_artifact", fails_for_onnxruntime)
    report = verify_model_dir(tiny_copy)
    assert report.passed and {f.detail for f in report.unverified} == {"unverified here: CUDA did not start (test)"}


def test_inspect_shows_the_gpu_each_gpu_artifact_was_built_on(cuda_artifact_dir: Path) -> None:
    inspect = run_rlopt("inspect", str(cuda_artifact_dir))
    assert inspect.returncode == 0, inspect.stderr
    lines = [line.strip() for line in inspect.stdout.splitlines()]
    assert lines.count("torchscript: GPU NVIDIA A10G (compute 8.6), driver 550.54.15, CUDA 12.8") == 2
    assert not any(line.startswith(("onnxruntime: GPU", "tvm: GPU")) for line in lines)
