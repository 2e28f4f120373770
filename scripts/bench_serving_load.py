"""One load process of scripts/bench_serving.py; prints one JSON line: requests, failures, latencies (us).

  http URL NETWORK SPEC THREADS DURATION         closed-loop batch-1 clients (tritonclient.http, binary tensors),
                                                 one per thread, for DURATION seconds
  inproc MODEL_DIR NETWORK SPEC THREADS DURATION MODE MAX_BATCH MAX_WAIT_US
                                                 the same from threads in this process: MODE `session` (one
                                                 Session shared by the threads) or `batcher` (rlopt.Batcher)

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
    for thread in threads:
        thread.join(duration + 120)
    merged = np.concatenate([np.asarray(x) for x in latencies]) if any(latencies) else np.empty(0)
    if merged.size > MAX_SAMPLES:
        merged = merged[np.linspace(0, merged.size - 1, MAX_SAMPLES).astype(np.int64)]
    return {"requests": int(sum(len(x) for x in latencies)), "failures": int(sum(failures)), "errors": errors,
            "latencies_us": [round(float(v), 1) for v in merged]}


def http_callers(url: str, network: str, spec: dict[str, list[Any]], threads: int) -> list[Callable[[], None]]:
    import tritonclient.http as client_module

    datatypes = {"float32": "FP32", "uint8": "UINT8", "int64": "INT64", "bool": "BOOL"}
    callers = []
    for index in range(threads):
        client = client_module.InferenceServerClient(url)
        inputs = []
        for name, value in inputs_for(spec, index).items():
            tensor = client_module.InferInput(name, list(value.shape), datatypes[str(value.dtype)])
            tensor.set_data_from_numpy(value)
            inputs.append(tensor)
        callers.append(lambda c=client, i=inputs: c.infer(network, i))
    return callers


def inproc_callers(model_dir: str, network: str, spec: dict[str, list[Any]], threads: int, mode: str,
                   max_batch: int, max_wait_us: float) -> tuple[list[Callable[[], None]], Callable[[], None]]:
    import rlopt

    session = rlopt.load(model_dir, network)
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
    if kind == "http":
        callers = http_callers(where, network, spec, int(threads))
        result = drive(callers, start_time(), float(duration))
    else:
        mode, max_batch, max_wait_us = argv[6:9]
        callers, close = inproc_callers(where, network, spec, int(threads), mode, int(max_batch), float(max_wait_us))
        try:
            result = drive(callers, start_time(), float(duration))
        finally:
            close()
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
