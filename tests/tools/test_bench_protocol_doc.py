"""scripts/bench_doc.py: rows over R runs from `rlopt bench` reports, the table set and docs/benchmarks.md's rewrite."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import pytest


def _doc() -> Any:
    spec = importlib.util.spec_from_file_location("rlopt_bench_doc", Path(__file__).parents[2] / "scripts" / "bench_doc.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _report(auto: list[float], aa: list[float], condition: str = "quiet") -> dict[str, Any]:
    """One run's report: the default policy's max shape, ONNX Runtime 1 thread at 100 us each round."""
    ort = [100.0] * len(auto)
    rounds = {"rlopt auto": auto, "onnxruntime 1 thread": ort, "onnxruntime 2 threads": [150.0] * len(auto),
              "onnxruntime 1 thread (A/A)": aa, "pytorch eager": [300.0] * len(auto)}
    shape = {"point": "max", "shape": {"x": [8, 16, 768]}, "gflop": 0.05, "round_medians_us": rounds}
    return {"networks": [{"network": "policy", "shapes": [shape], "workers": {"rlopt auto": {"backend": "auto"}}}],
            "condition": condition}


def _results(runs: list[dict[str, Any]]) -> dict[str, Any]:
    return {"models": [{"name": "policy-value-heads", "origin": "bundled recipe", "tuned": True, "runs": runs,
                        "compile_error": None, "run_errors": [],
                        "auto_routes": {"policy": {"1x1x768": "onnxruntime", "8x16x768": "tvm"}},
                        "auto_route_details": {"policy": {"1x1x768": "onnxruntime (pool)",
                                                          "8x16x768": "tvm (1 thread)"}},
                        "route_measured": {"policy": "2026-12-06 04:12:00 UTC, others held 0.10 cores"}},
                       {"name": "gru_cell_state", "origin": "coverage matrix", "tuned": False, "runs": [],
                        "compile_error": "exit 2: something refused", "run_errors": []}],
            "created_at": "2026-12-03 14:00 UTC", "commit": "abc1234", "machine_line": "CPU X, 2 cores, no GPU",
            "load_average_at_start": [0.1, 0.1, 0.1], "load_average_at_end": [1.0, 0.5, 0.2], "seconds": 1200.0,
            "protocol": {"runs": len(runs), "rounds": 3}, "limits": {"fma_peak_gflops": 500.0, "cores": 2,
                                                                     "sgemm_gflops": 200.0},
            "conditions": {"quiet": "as it is", "busy": "a spinning process"}}


def test_rows_pair_rounds_per_run_and_judge_the_row_over_runs() -> None:
    doc = _doc()
    runs = [_report([90.0, 95.0, 100.0], [100.0, 102.0, 104.0]),  # auto 0.95, A/A 1.02
            _report([104.0, 104.0, 104.0], [100.0, 100.0, 100.0]),  # 1.04 <= 1.05
            _report([130.0, 125.0, 300.0], [100.0, 100.0, 100.0])]  # a stalled run: 1.30
    rows = doc.collect_rows(_results(runs)["models"])
    assert len(rows) == 1
    row = rows[0]
    assert [r["auto"] for r in row["runs"]] == [0.95, 1.04, 1.3]
    assert [r["aa"] for r in row["runs"]] == [1.02, 1.0, 1.0]
    assert row["auto"] == 1.04 and row["eager"] == 3.0 and row["sb3"] is None
    assert row["backend"] == "tvm" and row["route"] == "tvm (1 thread)"  # auto's route there, from the manifest
    assert row["route_measured"].startswith("2026-12-06 04:12:00 UTC") and row["condition"] == "quiet"
    assert row["spread"] == {"min": 0.95, "max": 1.3, "relative": pytest.approx(0.3684, abs=1e-4)}
    assert row["verdict"]["within"] == 2 and not row["verdict"]["passed"]
    assert row["verdict"]["reason"] == "worst run 1.30 > 1.2"
    assert row["peer_best"] == "1 thread" and row["peer_best_us"] == 100.0 and row["auto_us"] == pytest.approx(104.0)
    spread = doc.default_policy_spread(rows)
    assert spread == {"relative": pytest.approx(0.3684, abs=1e-4), "runs": 3, "passed": False}
    text = doc.table_set(_results(runs), rows)
    assert "Default policy, max shape (quiet): auto / best spread over 3 runs 36.8% (over 15%)." in text


def test_a_busy_core_condition_gets_rows_of_its_own_and_a_peer_can_be_the_best() -> None:
    doc = _doc()
    busy = _report([150.0, 150.0, 150.0], [100.0, 100.0, 100.0], "busy")
    busy["networks"][0]["shapes"][0]["round_medians_us"]["peer openvino"] = [75.0, 75.0, 75.0]
    busy["networks"][0]["shapes"][0]["round_medians_us"]["peer openvino (A/A)"] = [78.0, 75.0, 75.0]
    rows = doc.collect_rows(_results([_report([90.0, 95.0, 100.0], [100.0, 102.0, 104.0]), busy])["models"])
    by_condition = {row["condition"]: row for row in rows}
    assert set(by_condition) == {"quiet", "busy"}
    assert by_condition["busy"]["peer_best"] == "openvino" and by_condition["busy"]["auto"] == 2.0
    assert by_condition["quiet"]["peer_best"] == "1 thread" and by_condition["quiet"]["auto"] == 0.95


def test_the_table_set_names_its_run_and_every_verdict() -> None:
    doc = _doc()
    results = _results([_report([90.0, 95.0, 100.0], [100.0, 102.0, 104.0])])
    text = doc.table_set(results, doc.collect_rows(results["models"]))
    assert text.startswith("## Run of 2026-12-03 14:00 UTC (commit abc1234, R = 1 runs, K = 3 rounds)")
    assert "CPU X, 2 cores, no GPU" in text
    assert "Default policy, max shape: one run, so no spread to judge." in text
    row = next(line for line in text.splitlines() if line.startswith("| policy-value-heads / policy"))
    cells = [c.strip() for c in row.strip("|").split("|")]
    assert cells[1:6] == ["yes", "max 8x16x768", "quiet", "tvm (1 thread)",
                          "2026-12-06 04:12:00 UTC, others held 0.10 cores"]
    assert cells[6:11] == ["95.0 us", "100.0 us (1 thread)", "0.95", "0.95-0.95 (0%)", "1.02"]
    assert cells[11:14] == ["3.00", "-", "pass (1/1 within)"]
    assert cells[14] == "60.0 us (167% of FMA peak)"  # 0.6 x 100 us; 0.05 GFLOP in 60 us = 833 GFLOP/s
    assert "Conditions: quiet: as it is, busy: a spinning process." in text
    assert "- gru_cell_state: exit 2: something refused" in text
    assert "Refit: not measured in this run." in text


def test_the_doc_keeps_its_hand_written_part_and_the_newest_sets(tmp_path: Path) -> None:
    doc = _doc()
    path = tmp_path / "benchmarks.md"
    path.write_text("# Benchmarks\n\nThe protocol, by hand.\n")
    for day in range(1, 5):
        doc.write_doc(path, f"## Run of 2026-12-0{day}\n\n| table {day} |\n")
    text = path.read_text()
    assert text.startswith("# Benchmarks\n\nThe protocol, by hand.\n\n" + doc.MARKER)
    assert [line for line in text.splitlines() if line.startswith("## Run of")] == [
        "## Run of 2026-12-04", "## Run of 2026-12-03", "## Run of 2026-12-02"]  # KEEP_SETS newest first
    assert "| table 4 |" in text and "| table 1 |" not in text
    assert not list(tmp_path.glob(".*.tmp"))
