"""`rlopt serve` with tritonclient's own HTTP and gRPC clients: metadata, outputs equal to `rlopt.load`'s for
every network (contract section 7's "matches"), 16 threads at once, metrics, and `--watch`'s reload."""

from __future__ import annotations

import threading
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.serve.repository import ServeOptions
from rlopt.serve.server import Server
from tests.conftest import CompileFactory, tiny_recipe_text
from tests.serve.conftest import running

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")


def http_infer(server: Server, network: str, feeds: dict[str, np.ndarray], binary: bool = True,
               **kwargs: object) -> object:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")
    inputs = []
    for name, value in feeds.items():
        tensor = httpclient.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value, binary_data=binary)
        inputs.append(tensor)
    try:
        return client.infer(network, inputs, **kwargs)
    finally:
        client.close()


def grpc_infer(server: Server, network: str, feeds: dict[str, np.ndarray], **kwargs: object) -> object:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    inputs = []
    for name, value in feeds.items():
        tensor = grpcclient.InferInput(name, list(value.shape), "FP32")
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    try:
        return client.infer(network, inputs, **kwargs)
    finally:
        client.close()


def assert_matches(got: np.ndarray, expected: np.ndarray) -> None:
    """Contract section 7: equal within the network's tolerance; a batched run of ONNX Runtime may round
    differently from a run of one request, so the tiny recipe's default atol applies."""
    assert got.shape == expected.shape and got.dtype == expected.dtype
    np.testing.assert_allclose(got, expected, rtol=1e-3, atol=1e-5)


def test_health_and_metadata(tiny_server: Server) -> None:
    client = httpclient.InferenceServerClient(f"127.0.0.1:{tiny_server.http_port}")
    assert client.is_server_live() and client.is_server_ready()
    assert client.is_model_ready("policy") and not client.is_model_ready("absent")
    assert client.get_server_metadata()["name"] == "rlopt"
    meta = client.get_model_metadata("policy")
    assert meta["versions"] == ["1"]
    assert meta["inputs"] == [{"name": "input0", "datatype": "FP32", "shape": [-1, -1, 32]}]
    assert meta["outputs"] == [{"name": "logits", "datatype": "FP32", "shape": [-1, -1, 5]}]
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{tiny_server.grpc_port}")
    assert grpc.is_server_live() and grpc.is_server_ready() and grpc.is_model_ready("value")
    value = grpc.get_model_metadata("value", as_json=True)
    assert value["outputs"] == [{"name": "value", "datatype": "FP32", "shape": ["-1", "-1", "1"]}]


@pytest.mark.parametrize("network", ["policy", "value"])
def test_both_clients_match_rlopt_load(tiny_server: Server, ort_tiny: Path, network: str) -> None:
    x = np.random.default_rng(1).standard_normal((3, 5, 32)).astype(np.float32)
    with rlopt.load(ort_tiny, network) as session:
        expected = session.run({"input0": x})
    output = session.outputs[0]
    assert_matches(http_infer(tiny_server, network, {"input0": x}).as_numpy(output), expected[output])
    json_result = http_infer(tiny_server, network, {"input0": x}, binary=False,
                             outputs=[httpclient.InferRequestedOutput(output, binary_data=False)])
    assert_matches(json_result.as_numpy(output), expected[output])
    assert_matches(grpc_infer(tiny_server, network, {"input0": x}).as_numpy(output), expected[output])


def test_sixteen_threads_get_their_own_answers(tiny_server: Server, ort_tiny: Path) -> None:
    """16 threads, each with its own inputs of batch 1 or 2, over both protocols: every answer is the thread's own
    (stacked with others' and split back), and the server batched some of them."""
    rng = np.random.default_rng(7)
    inputs = [rng.standard_normal((1 + i % 2, 4, 32)).astype(np.float32) for i in range(16)]
    with rlopt.load(ort_tiny, "policy") as session:
        expected = [session.run({"input0": x})["logits"] for x in inputs]
    errors: list[str] = []
    barrier = threading.Barrier(16)

    def client(index: int) -> None:
        barrier.wait()
        for _ in range(15):
            call = http_infer if index % 2 else grpc_infer
            got = call(tiny_server, "policy", {"input0": inputs[index]}).as_numpy("logits")  # type: ignore[attr-defined]
            if got.shape != expected[index].shape or not np.allclose(got, expected[index], rtol=1e-3, atol=1e-5):
                errors.append(f"thread {index}: wrong answer")

    threads = [threading.Thread(target=client, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    text = urllib.request.urlopen(f"http://127.0.0.1:{tiny_server.metrics_port}/metrics", timeout=10).read().decode()
    count = _metric(text, 'rlopt_batch_size_count{network="policy"}')
    rows = _metric(text, 'rlopt_batch_size_sum{network="policy"}')
    assert rows >= 16 * 15 * 1.5 - 1 and rows / count > 1.0, "requests were stacked into shared runs"


def _metric(text: str, name: str) -> float:
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"{name} not in the metrics")


def test_metrics_name_requests_failures_and_the_manifest(tiny_server: Server, ort_tiny: Path) -> None:
    x = np.zeros((1, 1, 32), np.float32)
    http_infer(tiny_server, "value", {"input0": x})
    with pytest.raises(Exception, match="outside the compiled profile"):
        http_infer(tiny_server, "value", {"input0": np.zeros((9, 1, 32), np.float32)})
    text = urllib.request.urlopen(f"http://127.0.0.1:{tiny_server.metrics_port}/metrics", timeout=10).read().decode()
    assert _metric(text, 'rlopt_requests_total{backend="onnxruntime",network="value"}') >= 2
    assert _metric(text, 'rlopt_request_failures_total{backend="onnxruntime",network="value",reason="shape"}') >= 1
    sha = rlopt.load(ort_tiny, "value").record  # the record is the manifest's; its sha is the manifest's
    assert sha is not None
    from rlopt.manifest import read_manifest

    assert _metric(text, f'rlopt_manifest_info{{content_sha256="{read_manifest(ort_tiny).content_sha256}"}}') == 1
    for name in ("rlopt_queue_seconds_bucket", "rlopt_compute_seconds_bucket", "rlopt_request_seconds_bucket",
                 "rlopt_queue_depth", "rlopt_live_sequences"):
        assert name in text


def test_watch_reloads_when_the_manifest_changes(compiled: CompileFactory, ort_tiny: Path, tmp_path: Path) -> None:
    """A MODEL_DIR replaced in place (as refit publishes one) is reloaded: answers switch to the new weights,
    the reload is counted and the manifest label moves."""
    import shutil

    other = compiled(tiny_recipe_text("[onnxruntime]").replace("seed: 3", "seed: 4"), name="tiny.yaml")
    served = tmp_path / "served"
    shutil.copytree(ort_tiny, served)
    x = np.random.default_rng(3).standard_normal((2, 3, 32)).astype(np.float32)
    with rlopt.load(other, "policy") as session:
        new = session.run({"input0": x})["logits"]
    with running(served, ServeOptions(networks=("policy",)), watch=True, housekeeping_s=0.05) as server:
        before = http_infer(server, "policy", {"input0": x}).as_numpy("logits")  # type: ignore[attr-defined]
        assert not np.allclose(before, new)
        staged = tmp_path / "staged"
        shutil.copytree(other, staged)
        shutil.rmtree(served)
        staged.rename(served)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            after = http_infer(server, "policy", {"input0": x}).as_numpy("logits")  # type: ignore[attr-defined]
            if np.allclose(after, new, rtol=1e-3, atol=1e-5):
                break
            time.sleep(0.05)
        assert_matches(after, new)
        text = urllib.request.urlopen(f"http://127.0.0.1:{server.metrics_port}/metrics", timeout=10).read().decode()
        assert _metric(text, 'rlopt_reloads_total{result="ok"}') == 1
        from rlopt.manifest import read_manifest

        assert f'content_sha256="{read_manifest(other).content_sha256}"' in text
        assert f'content_sha256="{read_manifest(ort_tiny).content_sha256}"' not in text


def test_drift_gauge_and_manifest_label_follow_the_loaded_manifest() -> None:
    from prometheus_client import generate_latest

    from rlopt.manifest import Drift
    from rlopt.serve.metrics import ServeMetrics

    metrics = ServeMetrics()
    metrics.loaded("a" * 64, {"policy": None})
    metrics.loaded("b" * 64, {"policy": Drift(kl_mean=0.01, kl_max=0.25, compared=8)})
    text = generate_latest(metrics.registry).decode()
    assert f'rlopt_manifest_info{{content_sha256="{"b" * 64}"}} 1.0' in text and "a" * 64 not in text
    assert _metric(text, 'rlopt_reload_drift_kl{network="policy",statistic="max"}') == 0.25
    assert _metric(text, 'rlopt_reload_drift_kl{network="policy",statistic="mean"}') == 0.01


def test_no_endpoint_loads_a_model_a_client_names(tiny_server: Server, tmp_path: Path) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{tiny_server.grpc_port}")
    with pytest.raises(Exception) as caught:
        client.load_model(str(tmp_path))
    assert caught.value.status() == "StatusCode.UNIMPLEMENTED"  # type: ignore[attr-defined]
    assert "MODEL_DIR" in caught.value.message()  # type: ignore[attr-defined]
    http = httpclient.InferenceServerClient(f"127.0.0.1:{tiny_server.http_port}")
    with pytest.raises(Exception, match="not an endpoint"):
        http.load_model(str(tmp_path))


def test_served_sessions_are_opened_with_pools_that_sleep_between_calls(ort_tiny: Path, monkeypatch) -> None:
    from rlopt.serve.repository import Repository

    opened: list[dict[str, object]] = []
    real = rlopt.load

    def recording(*args: object, **kwargs: object) -> rlopt.Session:
        opened.append(kwargs)
        return real(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(rlopt, "load", recording)
    repository = Repository(ort_tiny, ServeOptions())
    try:
        assert opened and all(kwargs.get("spinning") is False for kwargs in opened)
        for network in repository.networks.values():
            runner = network.session._gen.runners["onnxruntime"]
            for session in [runner._session, *runner._by_shape.values()]:
                options = session.get_session_options()
                assert options.intra_op_num_threads == 1 or \
                    options.get_session_config_entry("session.intra_op.allow_spinning") == "0"
    finally:
        repository.close()
