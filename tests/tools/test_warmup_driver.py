"""rlopt.tools.warmup.driver: runs on the tiny MODEL_DIR: the report and plot, consistency under load, SLO, Ctrl-C.

Runs use 0.5-1 s durations on the tiny MODEL_DIR; nothing here asserts a wall-clock threshold.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from rlopt.backends.base import Runner
from rlopt.errors import ArtifactError, UsageError
from rlopt.tools.warmup import LiveStatus, WarmupResult, run_warmup
from tests.conftest import assert_one_line_error, run_rlopt, tensorrt_missing
from tests.tools.common import TINY_PROFILE, with_changes, write_profile


def check_report_structure(document: dict[str, Any], model_dir: Path) -> None:
    assert document["kind"] == "rlopt-warmup" and document["network"] == "policy"
    assert document["backend"] in ("onnxruntime", "torchscript", "tvm")
    assert document["requests"] == sum(shape["count"] for shape in document["shapes"]) > 0
    assert [s["label"] for s in document["shapes"]] == ["1x1x32", "2x3x32", "4x6x32"]
    assert abs(sum(s["share"] for s in document["shapes"]) - 1) < 1e-6
    for shape in document["shapes"]:
        assert shape["first_call_ms"] > 0 and shape["throughput_rps"] >= 0
        summaries = [s for s in (shape["before_steady"], shape["after_steady"]) if s]
        assert shape["count"] == 0 or sum(s["count"] for s in summaries) == shape["count"]
        for summary in summaries:
            assert 0 < summary["p50_ms"] <= summary["p95_ms"] <= summary["p99_ms"] <= summary["max_ms"]
        assert shape["steady_reached"] == (shape["time_to_steady_s"] is not None)
    consistency = document["consistency"]
    assert consistency["passed"] and consistency["compared"] >= 2 and consistency["divergences"] == []
    assert len(consistency["probes"]) == 3
    assert document["machine"]["cpu"] and document["machine"]["threads"]["concurrency"] == 2
    assert Path(document["files"]["json"]) == model_dir / "reports" / "warmup-tiny.json"
    assert json.loads(Path(document["files"]["json"]).read_text()) == document
    assert Path(document["files"]["png"]).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow  # CLI compiles or runs in fresh processes: `make test-all`
def test_reference_spelling_runs_writes_report_and_plot_and_verify_still_passes(ort_copy: Path,
                                                                               tmp_path: Path) -> None:
    profile = write_profile(tmp_path, TINY_PROFILE)
    proc = run_rlopt("warmup", "--model_dir", str(ort_copy), "--profile", str(profile), "--duration", "1",
                     "--concurrency", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    check_report_structure(json.loads(proc.stdout), ort_copy)
    verify = run_rlopt("verify", str(ort_copy), "--json")
    assert verify.returncode == 0 and json.loads(verify.stdout)["passed"], verify.stdout



@pytest.mark.parametrize("args", [
    ("--profile", "{profile}"),
    ("{model_dir}", "--model_dir", "/elsewhere", "--profile", "{profile}"),
])
def test_model_dir_usage_errors_are_one_line(ort_copy: Path, tmp_path: Path, args: tuple[str, ...]) -> None:
    profile = write_profile(tmp_path, TINY_PROFILE)
    proc = run_rlopt("warmup", *[a.format(profile=profile, model_dir=ort_copy) for a in args])
    assert_one_line_error(proc, 2, "MODEL_DIR", "fix:")


def test_bad_profile_through_the_cli_is_one_line_exit_2(ort_copy: Path, tmp_path: Path) -> None:
    profile = write_profile(tmp_path, with_changes(requests=[{"weight": 1, "shapes": {"input0": [9, 1, 32]}}]))
    proc = run_rlopt("warmup", str(ort_copy), "--profile", str(profile), "--duration", "1")
    assert_one_line_error(proc, 2, str(profile), "requests.0.shapes.input0", "outside the compiled profile")


def test_slo_missed_exits_1(ort_copy: Path, tmp_path: Path) -> None:
    profile = write_profile(tmp_path, with_changes(slo={"p99_ms": 1e-6}))
    proc = run_rlopt("warmup", str(ort_copy), "--profile", str(profile), "--duration", "0.5", "--backend",
                     "onnxruntime", "--json")
    assert proc.returncode == 1, proc.stderr
    report = json.loads(proc.stdout)
    assert report["slo"]["passed"] is False and report["slo"]["measured_p99_ms"] > 1e-6
    assert any(f.startswith("SLO missed") for f in report["failures"]) and "SLO missed" in proc.stderr
    assert report["consistency"]["passed"]


class NoisyUnderLoad(Runner):
    """A test double: the real ONNX Runtime runner, plus noise on calls from any thread but the main one.

    It models a backend whose results change under concurrency (a data race); single-threaded it is exact.
    """

    def __init__(self, inner: Any, noise: float) -> None:
        self._inner = inner
        self.input_names = inner.input_names
        self._noise = noise

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        outputs = self._inner.infer(feeds)
        if threading.current_thread() is threading.main_thread():
            return outputs
        return [out + np.float32(self._noise) for out in outputs]

    def close(self) -> None:
        self._inner.close()


def install_noisy_onnxruntime(monkeypatch: pytest.MonkeyPatch, noise: float) -> None:
    from rlopt import backends

    real = backends.RUNNERS["onnxruntime"]
    monkeypatch.setitem(backends.RUNNERS, "onnxruntime",
                        lambda path, names, facts: NoisyUnderLoad(real(path, names, facts), noise))


def test_divergence_under_load_is_reported_and_exits_1(ort_copy: Path, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch,
                                                       capsys: pytest.CaptureFixture[str]) -> None:
    from rlopt.cli import main

    install_noisy_onnxruntime(monkeypatch, noise=1e-2)
    profile = write_profile(tmp_path, TINY_PROFILE)
    with pytest.raises(SystemExit) as exit_info:
        main(["warmup", str(ort_copy), "--profile", str(profile), "--duration", "0.5", "--backend", "onnxruntime",
              "--json"])
    assert exit_info.value.code == 1
    report = json.loads(capsys.readouterr().out)
    consistency = report["consistency"]
    assert not consistency["passed"] and consistency["divergences"]
    assert consistency["max_abs_diff"] == pytest.approx(1e-2, rel=1e-3)
    assert {d["output"] for d in consistency["divergences"]} == {"logits"}
    assert report["failures"][0].startswith("consistency under load")
    saved = json.loads((ort_copy / "reports" / "warmup-tiny.json").read_text())
    assert saved["consistency"]["passed"] is False


def test_noise_within_atol_is_consistent(ort_copy: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The same double with noise below the network's atol (1e-4) passes: the check uses the recipe's atol."""
    install_noisy_onnxruntime(monkeypatch, noise=1e-6)
    result = run_warmup(ort_copy, write_profile(tmp_path, TINY_PROFILE), duration_s=0.5, backend="onnxruntime")
    assert result.report.consistency.passed and result.report.passed
    assert 0 < result.report.consistency.max_abs_diff <= 1e-4


def test_ctrl_c_ends_early_with_a_partial_report(ort_copy: Path, tmp_path: Path) -> None:
    seen: list[LiveStatus] = []

    def interrupt_under_load(status: LiveStatus) -> None:
        seen.append(status)
        if status.phase == "under load" and status.requests > 0:
            raise KeyboardInterrupt

    result: WarmupResult = run_warmup(ort_copy, write_profile(tmp_path, TINY_PROFILE), duration_s=60,
                                      backend="onnxruntime", monitor=interrupt_under_load)
    assert result.report.interrupted
    assert result.report.requests > 0 and result.report.consistency.compared > 0
    assert json.loads((ort_copy / "reports" / "warmup-tiny.json").read_text())["interrupted"] is True
    assert seen[0].phase == "first calls" and seen[-1].phase == "done"


@pytest.mark.parametrize(("options", "error", "needle"), [
    ({"duration_s": 0}, UsageError, "--duration 0: must be a finite number of seconds > 0"),
    ({"duration_s": float("inf")}, UsageError, "--duration inf"),
    ({"concurrency": 0}, UsageError, "--concurrency 0: must be >= 1"),
    pytest.param({"backend": "tensorrt"}, ArtifactError, "skipped at compile time", marks=pytest.mark.skipif(
        tensorrt_missing() is None, reason="TensorRT builds on this machine: nothing was skipped")),
    ({"backend": "jax"}, UsageError, "backend 'jax' is unknown"),
])
def test_option_errors(tiny_compiled: Path, tmp_path: Path, options: dict[str, Any], error: type[Exception],
                       needle: str) -> None:
    with pytest.raises(error, match="fix:") as caught:
        run_warmup(tiny_compiled, write_profile(tmp_path, TINY_PROFILE), write_files=False,
                   **({"duration_s": 1} | options))
    assert needle in str(caught.value)


class PinsItsCaller(Runner):
    """A test double: the real runner, but each call pins the calling thread to one core (as TVM's pool does)."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner
        self.input_names = inner.input_names

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        if threading.current_thread() is not threading.main_thread():
            os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})
        return self._inner.infer(feeds)

    def close(self) -> None:
        self._inner.close()


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or len(os.sched_getaffinity(0)) < 2,
                    reason="needs two usable cores")
def test_a_runtime_that_pins_load_threads_is_reported(tiny_compiled: Path, tmp_path: Path,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt import backends

    real = backends.RUNNERS["onnxruntime"]
    monkeypatch.setitem(backends.RUNNERS, "onnxruntime", lambda path, names, facts: PinsItsCaller(real(path, names,
                                                                                                        facts)))
    result = run_warmup(tiny_compiled, write_profile(tmp_path, TINY_PROFILE), duration_s=0.5, backend="onnxruntime",
                        write_files=False)
    assert result.passed and len(result.report.warnings) == 1
    assert "narrowed the CPU affinity" in result.report.warnings[0]




def test_ids_without_a_recipe_range_are_drawn_from_the_rows_of_their_table() -> None:
    """The default 0-9 would leave a 3-row table, and Session.run refuses ids outside `index_range`."""
    from rlopt.manifest import InputProfile, NetworkRecord
    from rlopt.tools.warmup.driver import _request_inputs
    from rlopt.warmup_profile import RequestSpec, WarmupProfile

    profile = WarmupProfile(network="net", requests=[RequestSpec(weight=1, shapes={"ids": [256, 8]})])
    ids = InputProfile(dtype="int64", min=[1, 8], opt=[4, 8], max=[256, 8], index_range=[0, 2])
    record = NetworkRecord.model_construct(inputs={"ids": ids})
    (_, (feeds,), _) = _request_inputs(profile, record, seed=0)
    assert feeds["ids"].dtype == np.int64 and set(np.unique(feeds["ids"])) == {0, 1, 2}
