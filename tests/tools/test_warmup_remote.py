"""`rlopt warmup --url`: the same profile and report, with the requests sent to a running `rlopt serve`
(HTTP or gRPC) and the probes compared with `rlopt.load`'s single-threaded outputs here."""

from __future__ import annotations

from pathlib import Path

import pytest

from rlopt.errors import UsageError
from rlopt.serve.repository import ServeOptions
from rlopt.tools.warmup import run_warmup
from rlopt.tools.warmup.remote import parse_url
from tests.conftest import CompileFactory, assert_one_line_error, run_rlopt, tiny_recipe_text
from tests.serve.conftest import running
from tests.tools.common import write_profile, with_changes

pytest.importorskip("tritonclient.http")


@pytest.fixture(scope="module")
def ort_dir(compiled: CompileFactory) -> Path:
    return compiled(tiny_recipe_text("[onnxruntime]"), name="tiny.yaml")


@pytest.mark.parametrize("scheme", ["http", "grpc"])
def test_warmup_drives_a_running_server(ort_dir: Path, tmp_path: Path, scheme: str) -> None:
    profile = write_profile(tmp_path, with_changes(duration_s=0.6, concurrency=3))
    with running(ort_dir, ServeOptions(networks=("policy",))) as server:
        port = server.http_port if scheme == "http" else server.grpc_port
        result = run_warmup(ort_dir, profile, url=f"{scheme}://127.0.0.1:{port}", write_files=False)
    report = result.report
    assert report.url == f"{scheme}://127.0.0.1:{port}" and report.backend == "onnxruntime"
    assert report.passed, report.failures
    assert report.consistency.passed and report.consistency.compared >= 3
    assert report.requests > 10 and [s.count > 0 for s in report.shapes] == [True, True, True]


def test_a_server_of_other_weights_fails_consistency(ort_dir: Path, compiled: CompileFactory, tmp_path: Path) -> None:
    other = compiled(tiny_recipe_text("[onnxruntime]").replace("seed: 3", "seed: 4"), name="tiny.yaml")
    profile = write_profile(tmp_path, with_changes(duration_s=0.3, concurrency=1))
    with running(other, ServeOptions(networks=("policy",))) as server:
        result = run_warmup(ort_dir, profile, url=f"http://127.0.0.1:{server.http_port}", write_files=False)
    assert not result.report.consistency.passed and result.report.consistency.divergences


def test_bad_urls_are_one_line(ort_dir: Path, tmp_path: Path) -> None:
    for url in ("ftp://x:1", "http://127.0.0.1", "127.0.0.1:8000"):
        with pytest.raises(UsageError, match="--url"):
            parse_url(url)
    profile = write_profile(tmp_path, with_changes(duration_s=0.2))
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        free = probe.getsockname()[1]
    assert_one_line_error(run_rlopt("warmup", str(ort_dir), "--profile", str(profile), "--url",
                                    f"http://127.0.0.1:{free}"), 2, "cannot reach the server")
