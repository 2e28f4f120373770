"""scripts/latency_check.py's verdict over repeated compile-then-bench pairs: within in a majority of the runs."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from latency_check import verdicts  # noqa: E402


def _row(ratio: float, backend: str = "tvm", point: str = "min") -> dict:
    return {"name": "m", "network": "net", "backend": backend, "point": point, "shape": {"x": [1, 4]},
            "manifest_p50_us": 10.0 * ratio, "bench_median_us": 10.0, "ratio": ratio, "within": ratio <= 1.5}


def test_a_row_within_in_two_of_three_runs_passes_with_its_median_ratio() -> None:
    (row,) = verdicts([[_row(1.7)], [_row(1.2)], [_row(1.1)]], 1.5)
    assert row["ratios"] == [1.7, 1.2, 1.1] and row["ratio"] == 1.2
    assert row["within_runs"] == 2 and row["within"] is True
    assert row["manifest_p50_us"] == [17.0, 12.0, 11.0] and row["bench_median_us"] == [10.0, 10.0, 10.0]


def test_a_row_within_in_one_of_three_runs_fails() -> None:
    (row,) = verdicts([[_row(1.7)], [_row(1.6)], [_row(1.1)]], 1.5)
    assert row["within_runs"] == 1 and row["within"] is False and row["ratio"] == 1.6


def test_rows_are_kept_apart_by_backend_and_point_and_a_row_missing_from_a_run_counts_as_outside_there() -> None:
    rows = verdicts([[_row(1.1), _row(1.1, "onnxruntime")], [_row(1.1)], [_row(1.1)]], 1.5)
    by_backend = {r["backend"]: r for r in rows}
    assert by_backend["tvm"]["within"] is True and by_backend["tvm"]["within_runs"] == 3
    assert by_backend["onnxruntime"]["within_runs"] == 1 and by_backend["onnxruntime"]["within"] is False
