"""TorchScript on CUDA with CUDA graphs (contract section 11), its CPU-side logic tested here with a torch whose CUDA
device is this CPU (tests/cuda_standin.py: graphs replay the captured aten ops on the same tensors, a host
synchronisation during capture raises, two threads replaying one graph raise): a graph per named shape, static
buffers that never leak into results, locking, eager for other shapes, the network's precision. On a GPU machine
the `gpu`-marked test compares the runner with eager PyTorch on the GPU; here it is skipped with the reason.
"""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pytest
import torch

from rlopt.backends.torchscript.cuda.runner import CudaTorchScriptRunner
from rlopt.backends.torchscript.runner import TorchScriptRunner, open_torchscript
from tests.cuda_standin import make_cuda_torch

NAMED = {"min": {"obs": [1, 6]}, "opt": {"obs": [4, 6]}, "max": {"obs": [8, 6]}}


class Heads(torch.nn.Module):
    """A policy head with a batch-1 branch, as the bundled heads have."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Linear(6, 16)
        self.head = torch.nn.Linear(16, 3)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        hidden = torch.tanh(self.body(obs))
        if obs.size(0) > 1:
            return self.head(hidden)
        return self.head(hidden) * 1.0


class Syncs(torch.nn.Module):
    """Reads a value back to the host mid-call: CUDA cannot capture that."""

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if bool(obs.sum() > 0):
            return obs * 2.0
        return obs - 1.0


def _scripted(module: torch.nn.Module, tmp_path: Path) -> Path:
    torch.manual_seed(0)
    path = tmp_path / "model.ts"
    torch.jit.save(torch.jit.script(module.eval()), str(path))
    return path


def _facts(**extra: object) -> dict[str, object]:
    return {"device": "cuda", "cuda_graphs": True, "graph_shapes": NAMED, "input_dtypes": {"obs": "float32"},
            "precision_built": "fp32", **extra}


@pytest.fixture()
def on_fake_cuda(monkeypatch: pytest.MonkeyPatch):
    fake = make_cuda_torch()
    monkeypatch.setattr("rlopt.backends.torchscript.cuda.gate.device", lambda: "cpu")
    monkeypatch.setattr("rlopt.backends.torchscript.cuda.gate.exact_fp32", lambda torch: None)
    return fake


def _eager(path: Path, x: np.ndarray) -> np.ndarray:
    runner = TorchScriptRunner(path, ["obs"], {})
    return runner.infer({"obs": x})[0]


def test_one_graph_per_named_shape_and_eager_for_the_rest(tmp_path: Path, on_fake_cuda) -> None:
    path = _scripted(Heads(), tmp_path)
    runner = CudaTorchScriptRunner(path, ["obs"], _facts(), torch=on_fake_cuda)
    assert set(runner.graphs) == {((1, 6),), ((4, 6),), ((8, 6),)}
    rng = np.random.default_rng(0)
    for batch in (1, 4, 8, 3):
        x = rng.standard_normal((batch, 6)).astype(np.float32)
        replays = {key: graph.graph.replays for key, graph in runner.graphs.items()}
        np.testing.assert_allclose(runner.infer({"obs": x})[0], _eager(path, x), atol=1e-6)
        replayed = [key for key, graph in runner.graphs.items() if graph.graph.replays != replays[key]]
        assert replayed == ([((batch, 6),)] if batch != 3 else []), batch
    assert set(runner.parity_variants()) == {"eager"}
    runner.close()


def test_results_are_copies_not_the_static_buffers(tmp_path: Path, on_fake_cuda) -> None:
    path = _scripted(Heads(), tmp_path)
    runner = CudaTorchScriptRunner(path, ["obs"], _facts(), torch=on_fake_cuda)
    first_input = np.ones((4, 6), np.float32)
    first = runner.infer({"obs": first_input})[0]
    kept = first.copy()
    runner.infer({"obs": -first_input})
    np.testing.assert_array_equal(first, kept)


def test_concurrent_calls_take_the_graph_lock(tmp_path: Path, on_fake_cuda) -> None:
    """The stand-in raises when two threads replay one graph at once; eight threads on three shapes must not."""
    path = _scripted(Heads(), tmp_path)
    runner = CudaTorchScriptRunner(path, ["obs"], _facts(), torch=on_fake_cuda)
    rng = np.random.default_rng(1)
    inputs = [rng.standard_normal((batch, 6)).astype(np.float32) for batch in (1, 4, 8, 4, 4, 8, 1, 4)]
    expected = [_eager(path, x) for x in inputs]
    errors: list[BaseException] = []
    start = threading.Barrier(len(inputs))

    def worker(index: int) -> None:
        start.wait()
        try:
            for _ in range(5):
                np.testing.assert_allclose(runner.infer({"obs": inputs[index]})[0], expected[index], atol=1e-6)
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(len(inputs))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert errors == []
    assert sum(graph.graph.replays for graph in runner.graphs.values()) == 5 * len(inputs)


def test_a_shape_cuda_cannot_capture_runs_eagerly_and_says_why(tmp_path: Path, on_fake_cuda) -> None:
    path = _scripted(Syncs(), tmp_path)
    runner = CudaTorchScriptRunner(path, ["obs"], _facts(), torch=on_fake_cuda)
    assert runner.graphs == {}
    events = runner.events()
    assert [e["shape"] for e in events] == ["min", "opt", "max"]
    assert all(e["event"] == "cuda graph not captured" and e["reason"] for e in events)
    x = np.arange(24, dtype=np.float32).reshape(4, 6)
    np.testing.assert_array_equal(runner.infer({"obs": x})[0], x * 2.0)


@pytest.mark.parametrize("precision, dtype", [("fp16", torch.float16), ("bf16", torch.bfloat16)])
def test_the_network_precision_runs_inside_with_fp32_at_the_edges(tmp_path: Path, on_fake_cuda, precision: str,
                                                                 dtype: torch.dtype) -> None:
    path = _scripted(Heads(), tmp_path)
    runner = CudaTorchScriptRunner(path, ["obs"], _facts(precision_built=precision), torch=on_fake_cuda)
    assert next(runner._module.parameters()).dtype == dtype
    x = np.random.default_rng(2).standard_normal((4, 6)).astype(np.float32)
    for out in (runner.infer({"obs": x})[0], runner.eager({"obs": x})[0]):
        assert out.dtype == np.float32
        np.testing.assert_allclose(out, _eager(path, x), atol=5e-2)


def test_without_cuda_graphs_every_call_is_eager(tmp_path: Path, on_fake_cuda) -> None:
    path = _scripted(Heads(), tmp_path)
    runner = CudaTorchScriptRunner(path, ["obs"], _facts(cuda_graphs=False), torch=on_fake_cuda)
    assert runner.graphs == {} and runner.parity_variants() == {}
    x = np.ones((4, 6), np.float32)
    np.testing.assert_allclose(runner.infer({"obs": x})[0], _eager(path, x), atol=1e-6)


def test_fp32_on_cuda_asks_torch_for_full_fp32() -> None:
    """cuDNN convolutions default to TF32 in torch 2.13: an fp32 artifact switches matmul, conv and RNN to ieee."""
    from rlopt.backends.torchscript.cuda.gate import exact_fp32

    settings = [torch.backends.cuda.matmul, torch.backends.cudnn.conv, torch.backends.cudnn.rnn]
    before = [setting.fp32_precision for setting in settings]
    try:
        exact_fp32(torch)
        assert [setting.fp32_precision for setting in settings] == ["ieee"] * 3
    finally:
        for setting, value in zip(settings, before):
            setting.fp32_precision = value


def test_the_descriptor_gates_cuda_artifacts_on_this_machine(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.backends import unavailable_reason

    monkeypatch.setattr("rlopt.backends.torchscript.cuda.gate.cuda_torch_absent_reason", lambda: "no NVIDIA GPU (test)")
    assert unavailable_reason("torchscript", {}) is None
    assert unavailable_reason("torchscript", {"device": "cuda"}) == \
        "TorchScript on CUDA needs an NVIDIA GPU and a CUDA build of torch: no NVIDIA GPU (test)"
    path = _scripted(Heads(), tmp_path)
    assert isinstance(open_torchscript(path, ["obs"], {}), TorchScriptRunner)
    with pytest.raises(Exception, match="TorchScript on CUDA needs an NVIDIA GPU"):
        open_torchscript(path, ["obs"], _facts())


def _no_cuda() -> str | None:
    from rlopt.backends.torchscript.cuda.gate import unavailable_reason

    return unavailable_reason()


@pytest.mark.gpu
@pytest.mark.skipif(_no_cuda() is not None, reason=str(_no_cuda()))
def test_graphs_on_the_gpu_match_eager_pytorch_on_the_gpu(tmp_path: Path) -> None:
    """On a GPU machine: every named shape through its CUDA graph, and an unnamed one eagerly, against the module run
    eagerly on the same GPU in fp32 (TF32 off), within the recipe's fp32 tolerances."""
    path = _scripted(Heads(), tmp_path)
    runner = CudaTorchScriptRunner(path, ["obs"], _facts())
    assert len(runner.graphs) == 3
    module = torch.jit.load(str(path), map_location="cuda").eval()
    rng = np.random.default_rng(3)
    for batch in (1, 4, 8, 3):
        x = rng.standard_normal((batch, 6)).astype(np.float32)
        with torch.inference_mode():
            expected = module(torch.from_numpy(x).cuda()).cpu().numpy()
        np.testing.assert_allclose(runner.infer({"obs": x})[0], expected, atol=1e-4, rtol=1e-3)
    runner.close()


def test_cuda_failing_when_the_module_loads_is_a_skip_and_a_bad_file_an_artifact_error(
        tmp_path: Path, on_fake_cuda, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt.errors import ArtifactError, BackendUnavailable

    (tmp_path / "broken.ts").write_bytes(b"not torchscript")
    with pytest.raises(ArtifactError, match="not a loadable TorchScript file"):
        CudaTorchScriptRunner(tmp_path / "broken.ts", ["obs"], _facts(), torch=on_fake_cuda)

    def cuda_error(*args: object, **kwargs: object) -> None:
        raise RuntimeError("CUDA error: no CUDA-capable device is detected")

    monkeypatch.setattr(torch.jit, "load", cuda_error)
    with pytest.raises(BackendUnavailable, match="TorchScript on CUDA could not start \\(CUDA error: no CUDA"):
        CudaTorchScriptRunner(_scripted(Heads(), tmp_path), ["obs"], _facts(), torch=on_fake_cuda)
