"""One load process of scripts/bench_serving.py; prints one JSON line: requests, failures, latencies (us), and the
CPU time this process spent per request.

  http URL NETWORK SPEC THREADS DURATION         closed-loop batch-1 clients, one per thread, for DURATION seconds:
                                                 as perf_analyzer does, each client's request body is encoded once
                                                 (by tritonclient.http's own encoder, binary tensors) and posted
                                                 over one keep-alive connection; each answer's status and output
                                                 header are checked
  tritonclient URL NETWORK SPEC THREADS DURATION the same through tritonclient.http's `infer` on every call
  inproc MODEL_DIR NETWORK SPEC THREADS DURATION MODE MAX_BATCH MAX_WAIT_US [spin|quiet]
                                                 the same from threads in this process: MODE `session` (one
                                                 Session shared by the threads) or `batcher` (rlopt.Batcher);
                                                 `quiet`: rlopt.load(..., spinning=False)

SPEC is JSON: input name -> [dtype, shape]. Each caller sends its own fixed random input. Once set up, the
process prints `ready` and reads the wall time to start at from stdin, so that every load process of a point
(started by scripts/bench_serving.py) times the same window however long its imports took.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from typing import Any, Callable

import numpy as np

MAX_SAMPLES = 50_000  # latencies reported per process (an even subsample past this)


def inputs_for(spec: dict[str, list[Any]], seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    feeds = {}
    for name, (dtype, shape) in spec.items():
        kind = np.dtype(dtype)
        if kind.kind in "iu":
            feeds[name] = rng.integers(0, 255 if kind == np.uint8 else 2, size=shape).astype(kind)
        else:
            feeds[name] = rng.standard_normal(shape).astype(kind)
    return feeds


def drive(callers: list[Callable[[], None]], start: float, duration: float) -> dict[str, Any]:
    """Each caller in its own thread, closed loop, timed from wall time `start` for `duration` seconds."""
    latencies: list[list[float]] = [[] for _ in callers]
    failures = [0] * len(callers)
    errors: list[str] = []

    def loop(index: int) -> None:
        call, own = callers[index], latencies[index]
        while time.time() < start:
            call()  # warm: connections open, first calls done, before the timed window
        end = start + duration
        clock = time.perf_counter
        while time.time() < end:
            began = clock()
            try:
                call()
            except Exception as exc:  # noqa: BLE001 -- a failed request is counted, the load goes on
                failures[index] += 1
                if len(errors) < 3:
                    errors.append(f"{type(exc).__name__}: {str(exc)[:200]}")
                continue
            own.append((clock() - began) * 1e6)

    threads = [threading.Thread(target=loop, args=(i,), daemon=True) for i in range(len(callers))]
    for thread in threads:
        thread.start()
    time.sleep(max(0.0, start - time.time()))
    cpu_start = time.process_time()
    for thread in threads:
        thread.join(duration + 120)
    cpu_s = time.process_time() - cpu_start
    merged = np.concatenate([np.asarray(x) for x in latencies]) if any(latencies) else np.empty(0)
    if merged.size > MAX_SAMPLES:
        merged = merged[np.linspace(0, merged.size - 1, MAX_SAMPLES).astype(np.int64)]
    requests = int(sum(len(x) for x in latencies))
    return {"requests": requests, "failures": int(sum(failures)), "errors": errors,
            "cpu_us_per_request": round(cpu_s * 1e6 / requests, 1) if requests else None,
            "latencies_us": [round(float(v), 1) for v in merged]}


def triton_inputs(spec: dict[str, list[Any]], index: int) -> list[Any]:
    import tritonclient.http as client_module

    from rlopt.serve.protocol import datatype_of

    inputs = []
    for name, value in inputs_for(spec, index).items():
        tensor = client_module.InferInput(name, list(value.shape), datatype_of(value.dtype))
        tensor.set_data_from_numpy(value)
        inputs.append(tensor)
    return inputs


def tritonclient_callers(url: str, network: str, spec: dict[str, list[Any]], threads: int
                         ) -> list[Callable[[], None]]:
    import tritonclient.http as client_module

    return [lambda c=client_module.InferenceServerClient(url), i=triton_inputs(spec, index): c.infer(network, i)
            for index in range(threads)]


def http_callers(url: str, network: str, spec: dict[str, list[Any]], threads: int) -> list[Callable[[], None]]:
    """Pre-encoded requests on keep-alive connections, so the load spends less of the 2 cores it shares with the
    server (atari CNN: 150-190 us of CPU per request, against 200-240 us through tritonclient's `infer`)."""
    import http.client

    import tritonclient.http as client_module

    host, port = url.rsplit(":", 1)
    path = f"/v2/models/{network}/infer"
    callers = []
    for index in range(threads):
        body, json_size = client_module.InferenceServerClient.generate_request_body(triton_inputs(spec, index))
        headers = {"Content-Type": "application/octet-stream"}
        if json_size is not None:
            headers["Inference-Header-Content-Length"] = str(json_size)
        connection = http.client.HTTPConnection(host, int(port))

        def call(connection: Any = connection, body: bytes = body, headers: dict[str, str] = headers) -> None:
            connection.request("POST", path, body, headers)
            response = connection.getresponse()
            answer = response.read()
            if response.status != 200:
                raise RuntimeError(f"HTTP {response.status}: {answer[:200]!r}")
            length = response.getheader("Inference-Header-Content-Length")
            header = json.loads(answer[:int(length)] if length is not None else answer)
            if not header.get("outputs"):
                raise RuntimeError(f"an answer without outputs: {answer[:200]!r}")

        callers.append(call)
    return callers


def inproc_callers(model_dir: str, network: str, spec: dict[str, list[Any]], threads: int, mode: str,
                   max_batch: int, max_wait_us: float, spinning: bool = True
                   ) -> tuple[list[Callable[[], None]], Callable[[], None]]:
    import rlopt

    session = rlopt.load(model_dir, network, spinning=spinning)
    target: Any = session if mode == "session" else rlopt.Batcher(session, max_batch, max_wait_us)
    feeds = [inputs_for(spec, index) for index in range(threads)]

    def close() -> None:
        if target is not session:
            target.close()
        session.close()

    return [lambda f=f: target.run(f) for f in feeds], close


def start_time() -> float:
    print("ready", flush=True)
    return float(sys.stdin.readline())


def main(argv: list[str]) -> int:
    kind, where, network, spec_text, threads, duration = argv[:6]
    spec = json.loads(spec_text)
    if kind in ("http", "tritonclient"):
        make = http_callers if kind == "http" else tritonclient_callers
        callers = make(where, network, spec, int(threads))
        result = drive(callers, start_time(), float(duration))
    else:
        mode, max_batch, max_wait_us = argv[6:9]
        spinning = (argv[9:] or ["spin"])[0] == "spin"
        callers, close = inproc_callers(where, network, spec, int(threads), mode, int(max_batch), float(max_wait_us),
                                        spinning)
        try:
            result = drive(callers, start_time(), float(duration))
        finally:
            close()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
