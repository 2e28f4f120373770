"""`rlopt warmup --url`: a running server (`rlopt serve`, or Triton serving the same MODEL_DIR) in place of a Session.

`RemoteSession` has the part of Session's interface warmup uses (`run`, `backend`, `close`): each calling thread
gets its own tritonclient client (HTTP for http://, gRPC for grpc://), inputs go as binary tensors, every output
comes back. The probes' expected outputs still come from `rlopt.load` in this process, single-threaded.
"""

from __future__ import annotations

import threading
from typing import Any
from urllib.parse import urlparse

import numpy as np

from rlopt.errors import UsageError
from rlopt.manifest import NetworkRecord

DATATYPES = {"bool": "BOOL", "uint8": "UINT8", "uint16": "UINT16", "uint32": "UINT32", "uint64": "UINT64",
             "int8": "INT8", "int16": "INT16", "int32": "INT32", "int64": "INT64", "float16": "FP16",
             "float32": "FP32", "float64": "FP64"}


def parse_url(url: str) -> tuple[str, str]:
    """('http' or 'grpc', 'host:port') from `http://host:port` or `grpc://host:port`."""
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "grpc") or not parsed.hostname or parsed.port is None \
            or parsed.path not in ("", "/"):
        raise UsageError(f"--url {url}: not a server address; fix: give http://HOST:PORT (rlopt serve's "
                         "--http-port) or grpc://HOST:PORT (its --grpc-port)")
    return parsed.scheme, parsed.netloc


class RemoteSession:
    """One network of a running server, callable from many threads like a Session."""

    def __init__(self, url: str, network: str, record: NetworkRecord) -> None:
        self.scheme, self.address = parse_url(url)
        self.url, self.network = url, network
        self.outputs = list(record.outputs)
        self._datatypes = {name: DATATYPES[p.dtype] for name, p in record.inputs.items()}
        self._local = threading.local()
        self._clients: list[Any] = []
        self._lock = threading.Lock()
        from rlopt.lazy import require

        self._tritonclient = require("tritonclient.grpc" if self.scheme == "grpc" else "tritonclient.http")
        client = self._client()
        try:
            ready = client.is_model_ready(network)
            metadata = client.get_model_metadata(network, **({"as_json": True} if self.scheme == "grpc" else {}))
        except Exception as exc:  # noqa: BLE001 -- any transport failure means the same thing to the user
            raise UsageError(f"--url {url}: cannot reach the server ({type(exc).__name__}: {exc}); fix: start "
                             "'rlopt serve MODEL_DIR' there, or correct the address") from None
        if not ready:
            raise UsageError(f"--url {url}: network '{network}' is not ready on the server; fix: serve it "
                             "(rlopt serve MODEL_DIR --network ...)")
        platform = str(metadata.get("platform", ""))
        self.backend = platform.removeprefix("rlopt_") if platform.startswith("rlopt_") else platform or "remote"

    def _client(self) -> Any:
        client = getattr(self._local, "client", None)
        if client is None:
            client = self._local.client = self._tritonclient.InferenceServerClient(self.address)
            with self._lock:
                self._clients.append(client)
        return client

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        module, client = self._tritonclient, self._client()
        inputs = []
        for name, value in feeds.items():
            tensor = module.InferInput(name, list(value.shape), self._datatypes[name])
            tensor.set_data_from_numpy(np.ascontiguousarray(value))
            inputs.append(tensor)
        result = client.infer(self.network, inputs)
        return {name: result.as_numpy(name) for name in self.outputs}

    def close(self) -> None:
        with self._lock:
            clients, self._clients = self._clients, []
        for client in clients:
            client.close()


__all__ = ["RemoteSession", "parse_url"]
