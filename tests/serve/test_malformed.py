"""Malformed requests: each a 4xx with `{"error": "..."}` naming the field (gRPC: the matching status), and the
server stays ready and keeps answering (contract section 12)."""

from __future__ import annotations

import http.client
import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from rlopt.serve.repository import ServeOptions
from rlopt.serve.server import Server
from tests.serve.conftest import running

grpcclient = pytest.importorskip("tritonclient.grpc")

X = np.zeros((1, 2, 32), np.float32)


def tensor(**override: object) -> dict[str, object]:
    return {"name": "input0", "datatype": "FP32", "shape": [1, 2, 32], "data": X.ravel().tolist()} | override


def body(*inputs: dict[str, object], **top: object) -> bytes:
    return json.dumps({"inputs": list(inputs)} | top).encode()


BINARY = json.dumps({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [1, 2, 32],
                                 "parameters": {"binary_data_size": 256}}]}).encode()

# (case, path, body, headers, status, the text the error must contain)
CASES = [
    ("unknown model", "/v2/models/nope/infer", body(tensor()), {}, 404, "model_name"),
    ("unknown version", "/v2/models/policy/versions/7/infer", body(tensor()), {}, 404, "model_version"),
    ("unknown input", "/v2/models/policy/infer", body(tensor(name="obs")), {}, 400, "inputs[0].name"),
    ("input given twice", "/v2/models/policy/infer", body(tensor(), tensor()), {}, 400, "inputs[1].name"),
    ("no inputs", "/v2/models/policy/infer", body(), {}, 400, "inputs"),
    ("unknown output", "/v2/models/policy/infer", body(tensor(), outputs=[{"name": "value"}]), {}, 400,
     "outputs[0].name"),
    ("wrong datatype", "/v2/models/policy/infer", body(tensor(datatype="INT32", data=[0] * 64)), {}, 400,
     "inputs[0].datatype"),
    ("unknown datatype", "/v2/models/policy/infer", body(tensor(datatype="BYTES")), {}, 400, "inputs[0].datatype"),
    ("wrong rank", "/v2/models/policy/infer", body(tensor(shape=[2, 32], data=[0.0] * 64)), {}, 400,
     "inputs[0].shape"),
    ("shape outside the profile", "/v2/models/policy/infer", body(tensor(shape=[5, 2, 32], data=[0.0] * 320)), {},
     400, "outside the compiled profile"),
    ("negative dim", "/v2/models/policy/infer", body(tensor(shape=[1, -2, 32])), {}, 400, "inputs[0].shape"),
    ("data shorter than the shape", "/v2/models/policy/infer", body(tensor(data=[0.0] * 63)), {}, 400,
     "inputs[0].data"),
    ("data of strings", "/v2/models/policy/infer", body(tensor(data=["a"] * 64)), {}, 400, "inputs[0].data"),
    ("no data", "/v2/models/policy/infer", body({"name": "input0", "datatype": "FP32", "shape": [1, 2, 32]}), {},
     400, "inputs[0].data"),
    ("binary tensor short", "/v2/models/policy/infer", BINARY + b"\0" * 100,
     {"Inference-Header-Content-Length": str(len(BINARY))}, 400, "binary_data_size"),
    ("header length past the body", "/v2/models/policy/infer", body(tensor()),
     {"Inference-Header-Content-Length": "999999"}, 400, "Inference-Header-Content-Length"),
    ("bad JSON", "/v2/models/policy/infer", b"{\"inputs\": [", {}, 400, "not valid JSON"),
    ("JSON not an object", "/v2/models/policy/infer", b"[1, 2]", {}, 400, "body"),
    ("empty body", "/v2/models/policy/infer", b"", {}, 400, "body: empty"),
    ("oversized body", "/v2/models/policy/infer", b" " * (3 << 20), {}, 413, "limit"),
    ("compressed body", "/v2/models/policy/infer", body(tensor()), {"Content-Encoding": "gzip"}, 415,
     "Content-Encoding"),
    ("sequence to a stateless network", "/v2/models/policy/infer",
     body(tensor(), parameters={"sequence_id": 5, "sequence_start": True}), {}, 400, "parameters.sequence_id"),
    ("priority not an integer", "/v2/models/policy/infer", body(tensor(), parameters={"priority": "high"}), {}, 400,
     "parameters.priority"),
    ("unknown path", "/v2/repository/models/x/load", b"{}", {}, 404, "path"),
]


@pytest.fixture(scope="module")
def server(ort_tiny: Path) -> Iterator[Server]:
    with running(ort_tiny, ServeOptions()) as started:
        yield started


def post(server: Server, path: str, payload: bytes, headers: dict[str, str]) -> tuple[int, dict[str, object]]:
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    try:
        connection.request("POST", path, payload, {"Content-Type": "application/json"} | headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read())
    finally:
        connection.close()


def test_at_least_fifteen_malformed_cases() -> None:
    assert len(CASES) >= 15


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_malformed_request_is_a_clear_4xx_and_the_server_stays_ready(server: Server, case: tuple) -> None:
    _, path, payload, headers, status, needle = case
    got, document = post(server, path, payload, headers)
    assert got == status, document
    assert set(document) == {"error"} and needle in str(document["error"]), document
    ok, answer = post(server, "/v2/models/policy/infer", body(tensor()), {})
    assert ok == 200 and answer["outputs"][0]["shape"] == [1, 2, 5]  # type: ignore[index]
    connection = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=30)
    connection.request("GET", "/v2/health/ready")
    assert connection.getresponse().status == 200


def test_grpc_errors_carry_the_matching_status(server: Server) -> None:
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}")
    good = grpcclient.InferInput("input0", [1, 2, 32], "FP32")
    good.set_data_from_numpy(X)
    wide = grpcclient.InferInput("input0", [5, 2, 32], "FP32")
    wide.set_data_from_numpy(np.zeros((5, 2, 32), np.float32))
    wrong = grpcclient.InferInput("input0", [1, 2, 32], "FP64")
    wrong.set_data_from_numpy(X.astype(np.float64))
    for name, inputs, kwargs, code, needle in [
            ("nope", [good], {}, "StatusCode.NOT_FOUND", "model_name"),
            ("policy", [wide], {}, "StatusCode.INVALID_ARGUMENT", "inputs[0].shape"),
            ("policy", [wrong], {}, "StatusCode.INVALID_ARGUMENT", "inputs[0].datatype"),
            ("policy", [good], {"sequence_id": 3, "sequence_start": True}, "StatusCode.INVALID_ARGUMENT",
             "parameters.sequence_id")]:
        with pytest.raises(Exception) as caught:
            client.infer(name, inputs, **kwargs)
        assert caught.value.status() == code and needle in caught.value.message()  # type: ignore[attr-defined]
    assert client.is_server_ready()
    assert client.infer("policy", [good]).as_numpy("logits").shape == (1, 2, 5)
