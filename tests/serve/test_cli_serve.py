"""`rlopt serve` as a process: SIGTERM under load answers what was accepted and exits 0; flag and extra errors
are one line with exit 2."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import assert_one_line_error, run_rlopt

BLOCK_SERVE = ("import sys\nsys.modules['uvicorn'] = None\nsys.argv = ['rlopt', 'serve', {model_dir!r}]\n"
               "from rlopt.cli import main\nmain()")


def start_server(model_dir: Path, *flags: str) -> tuple[subprocess.Popen[str], int]:
    """`python -m rlopt serve` on free ports; returns the process and its HTTP port, once it serves."""
    process = subprocess.Popen([sys.executable, "-m", "rlopt", "serve", str(model_dir), "--http-port", "0",
                                "--grpc-port", "0", "--metrics-port", "0", *flags],
                               stderr=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                               env=dict(os.environ, COLUMNS="300"))
    assert process.stderr is not None
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        found = re.search(r"on http://127\.0\.0\.1:(\d+)", line)
        if found:
            return process, int(found.group(1))
        if not line and process.poll() is not None:
            break
    process.kill()
    raise AssertionError(f"the server did not start: {process.stderr.read()}")


def request_body() -> bytes:
    x = np.zeros((1, 2, 32), np.float32)
    return json.dumps({"inputs": [{"name": "input0", "datatype": "FP32", "shape": [1, 2, 32],
                                   "data": x.ravel().tolist()}]}).encode()


def test_sigterm_under_load_answers_what_was_accepted_and_exits_zero(ort_tiny: Path) -> None:
    process, port = start_server(ort_tiny, "--max-wait-us", "2000")
    body, stop = request_body(), threading.Event()
    answered: list[float] = []
    wrong: list[str] = []
    refused = [0]
    lock = threading.Lock()

    def client() -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        for _ in range(2000):  # bounded: the loop ends on its own even if the server never stops
            if stop.is_set():
                return
            try:
                connection.request("POST", "/v2/models/policy/infer", body, {"Content-Type": "application/json"})
                response = connection.getresponse()
                payload = response.read()
            except (ConnectionError, http.client.HTTPException, OSError):
                with lock:
                    refused[0] += 1  # not accepted: the server had stopped taking requests
                connection.close()
                if process.poll() is not None:
                    return
                connection = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
                time.sleep(0.01)
                continue
            with lock:
                if response.status == 200 and json.loads(payload)["outputs"][0]["shape"] == [1, 2, 5]:
                    answered.append(time.monotonic())
                else:
                    wrong.append(f"{response.status}: {payload[:200]!r}")

    threads = [threading.Thread(target=client) for _ in range(16)]
    for thread in threads:
        thread.start()
    while len(answered) < 200 and process.poll() is None:
        time.sleep(0.01)
    sent_at = time.monotonic()
    process.send_signal(signal.SIGTERM)
    try:
        code = process.wait(60)
    finally:
        stop.set()
        for thread in threads:
            thread.join(60)
    stderr = process.stderr.read() if process.stderr else ""
    assert code == 0, stderr
    assert wrong == [], wrong[:3]
    assert len(answered) >= 200
    assert any(at > sent_at for at in answered), "requests in flight at SIGTERM were answered"
    assert "every accepted request was answered" in stderr


def test_serve_without_the_extra_says_what_to_install(ort_tiny: Path) -> None:
    proc = subprocess.run([sys.executable, "-c", BLOCK_SERVE.format(model_dir=str(ort_tiny))], capture_output=True,
                          text=True, timeout=120)
    assert_one_line_error(proc, 2, "pip install 'rlopt[serve]'", "uvicorn")


@pytest.mark.parametrize("flags, needle", [
    (["--max-batch", "0"], "--max-batch 0"),
    (["--max-wait-us", "-1"], "--max-wait-us -1"),
    (["--http-port", "70000"], "--http-port 70000"),
    (["--sequence-idle-s", "0"], "--sequence-idle-s"),
    (["--network", "absent"], "--network absent"),
])
def test_bad_flags_are_one_line(ort_tiny: Path, flags: list[str], needle: str) -> None:
    assert_one_line_error(run_rlopt("serve", str(ort_tiny), "--http-port", "0", "--grpc-port", "0",
                                    "--metrics-port", "0", *flags), 2, needle)


def test_a_port_in_use_is_one_line(ort_tiny: Path) -> None:
    import socket

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert_one_line_error(run_rlopt("serve", str(ort_tiny), "--http-port", str(port), "--grpc-port", "0",
                                        "--metrics-port", "0"), 2, f"127.0.0.1:{port}", "--http-port")
