"""rlopt.tools.bench.analysis: the per-shape statistics, on made-up samples."""

from __future__ import annotations

import numpy as np
import pytest

from rlopt.tools.bench.analysis import affinity_warnings, rounds_of, shape_results
from rlopt.tools.bench.schema import NetworkBench, WorkerInfo


def test_rows_are_fastest_first_with_ratios_to_the_best_onnxruntime() -> None:
    samples = {"onnxruntime 1 thread": np.full(14, 4000), "onnxruntime 2 threads": np.full(14, 2000),
               "rlopt tvm": np.array([1000] * 13 + [9000]), "silent": np.empty(0, dtype=np.int64)}
    first_ms = dict.fromkeys(samples, 2.0)
    candidates = [("onnxruntime 1 thread", "baseline"), ("onnxruntime 2 threads", "baseline"), ("rlopt tvm", "rlopt"),
                  ("silent", "test")]
    results, ort_best = shape_results(samples, first_ms, candidates, gflop=0.002,
                                      yardsticks={"onnxruntime 1 thread", "onnxruntime 2 threads"})
    assert ort_best == "onnxruntime 2 threads"
    assert [r.candidate for r in results] == ["rlopt tvm", "onnxruntime 2 threads", "onnxruntime 1 thread"]
    tvm = results[0]
    assert tvm.median_us == 1.0 and tvm.ratio_to_ort_best == 0.5 and tvm.calls == 14 and tvm.group == "rlopt"
    assert tvm.p99_us == pytest.approx(np.percentile([1.0] * 13 + [9.0], 99), abs=0.01)
    assert tvm.gflops_per_s == pytest.approx(0.002 / 1e-6) and tvm.first_call_ms == 2.0
    assert rounds_of({k: v for k, v in samples.items() if v.size}, 7) == 2 and rounds_of({}, 7) == 0


def test_the_yardstick_candidates_are_onnx_runtime_sessions_and_rlopts_onnx_runtime_backend() -> None:
    from rlopt.tools.bench.candidates import CandidateSpec, is_yardstick

    def spec(kind: str, backend: str | None = None) -> CandidateSpec:
        return CandidateSpec("c", "g", "", kind, "dir", "policy", backend=backend)  # type: ignore[arg-type]

    assert is_yardstick(spec("onnx session")) and is_yardstick(spec("rlopt", "onnxruntime"))
    assert not any(is_yardstick(s) for s in (spec("rlopt", "tvm"), spec("rlopt", "auto"), spec("eager"),
                                               spec("torchscript module")))


def test_no_onnxruntime_means_no_ratio() -> None:
    results, ort_best = shape_results({"a": np.full(7, 500)}, {"a": 1.0}, [("a", "rlopt")], gflop=None)
    assert ort_best is None and results[0].ratio_to_ort_best is None and results[0].gflops_per_s is None


def test_a_narrowed_affinity_is_a_warning() -> None:
    net = NetworkBench(network="value", eager_source=None, candidates={}, skipped=[], shapes=[],
                       workers={"rlopt tvm": WorkerInfo(pid=1, cores=[0]), "rlopt auto": WorkerInfo(pid=2, cores=[0, 1])})
    [warning] = affinity_warnings([net], {0, 1})
    assert warning.startswith("value / rlopt tvm: its process's CPU affinity was cores [0]")
