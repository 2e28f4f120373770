"""scripts/latency_check.py's verdict over re-timed manifests, each between two benches: within in a majority of the
runs whose two benches agreed (an A/A pair), undecided where none did."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from latency_check import compare, verdicts  # noqa: E402


def _row(ratio: float, backend: str = "tvm", point: str = "min", decided: bool = True) -> dict:
    return {"name": "m", "network": "net", "backend": backend, "point": point, "shape": {"x": [1, 4]},
            "manifest_p50_us": 10.0 * ratio, "bench_median_us": 10.0, "bench_aa": 1.0 if decided else 2.0,
            "ratio": ratio, "decided": decided, "within": ratio <= 1.5}


def test_a_row_within_in_two_of_three_runs_passes_with_its_median_ratio() -> None:
    (row,) = verdicts([[_row(1.7)], [_row(1.2)], [_row(1.1)]], 1.5)
    assert row["ratios"] == [1.7, 1.2, 1.1] and row["ratio"] == 1.2
    assert row["within_runs"] == 2 and row["within"] is True
    assert row["manifest_p50_us"] == [17.0, 12.0, 11.0] and row["bench_median_us"] == [10.0, 10.0, 10.0]


def test_a_row_within_in_one_of_three_runs_fails() -> None:
    (row,) = verdicts([[_row(1.7)], [_row(1.6)], [_row(1.1)]], 1.5)
    assert row["within_runs"] == 1 and row["within"] is False and row["ratio"] == 1.6


def test_a_run_whose_benches_disagree_does_not_count_and_a_row_no_run_decided_is_undecided() -> None:
    (row,) = verdicts([[_row(1.9, decided=False)], [_row(1.7)], [_row(1.1)], [_row(1.2)]], 1.5)
    assert row["decided_runs"] == 3 and row["within_runs"] == 2 and row["within"] is True and row["ratio"] == 1.2
    (row,) = verdicts([[_row(1.9, decided=False)], [_row(1.1, decided=False)]], 1.5)
    assert row["decided_runs"] == 0 and row["within"] is None
    (row,) = verdicts([[_row(1.9, decided=False)], [_row(1.7)], [_row(1.1)]], 1.5)
    assert row["within"] is False, "one of two decided runs within is no majority"


def test_rows_are_kept_apart_by_backend_and_point_and_a_row_missing_from_a_run_counts_as_outside_there() -> None:
    rows = verdicts([[_row(1.1), _row(1.1, "onnxruntime")], [_row(1.1)], [_row(1.1)]], 1.5)
    by_backend = {r["backend"]: r for r in rows}
    assert by_backend["tvm"]["within"] is True and by_backend["tvm"]["within_runs"] == 3
    assert by_backend["onnxruntime"]["within_runs"] == 1 and by_backend["onnxruntime"]["within"] is False


def test_the_manifest_is_held_against_the_geometric_mean_of_the_benches_around_it(tmp_path: Path) -> None:
    manifest = {"name": "m", "networks": {"net": {"artifacts": {
        "tvm": {"latency_us": {"min": {"p50": 30.0}, "max": {"p50": 30.0}}},
        "onnxruntime": {"latency_us": {"min": {"p50": 10.0}}}}}}}
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    before = {("net", "tvm", "min"): (20.0, [1]), ("net", "tvm", "max"): (10.0, [8]),
              ("net", "onnxruntime", "min"): (10.0, [1])}
    after = {("net", "tvm", "min"): (20.0, [1]), ("net", "tvm", "max"): (40.0, [8])}  # onnxruntime's bench lost
    rows = {(r["backend"], r["point"]): r for r in compare(tmp_path, before, after, 1.5)}
    assert set(rows) == {("tvm", "min"), ("tvm", "max")}
    assert rows["tvm", "min"]["bench_median_us"] == 20.0 and rows["tvm", "min"]["decided"] is True
    assert rows["tvm", "min"]["ratio"] == 1.5 and rows["tvm", "min"]["within"] is True
    assert rows["tvm", "max"]["bench_median_us"] == 20.0 and rows["tvm", "max"]["bench_aa"] == 4.0
    assert rows["tvm", "max"]["decided"] is False, "the host moved 4x between the benches"
    alone = compare(tmp_path, None, after, 1.5)
    assert all(r["bench_aa"] is None and r["decided"] for r in alone)
