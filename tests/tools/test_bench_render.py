"""`rlopt bench` through the CLI: the human tables (readable when piped) and one-line user errors."""

from __future__ import annotations

import pytest

from pathlib import Path

from rlopt.render.bench import bench_tables
from rlopt.tools.bench import BenchReport, CandidateResult, NetworkBench, ShapeBench, Skip
from tests.conftest import assert_one_line_error, run_rlopt
from tests.tools.common import run_piped


@pytest.mark.slow  # CLI compiles or runs in fresh processes: `make test-all`
def test_human_table(ort_compiled: Path) -> None:
    """Piped, with no COLUMNS: the table is laid out at 100 columns, whole, and the progress goes to stderr as
    plain lines."""
    proc = run_piped("bench", str(ort_compiled), "--network", "value", "--budget", "0.02", "--no-flops")
    assert proc.returncode == 0, proc.stderr
    assert "x ORT best" in proc.stdout and "onnxruntime 1 thread" in proc.stdout and "not run:" in proc.stdout
    assert max(len(line) for line in proc.stdout.splitlines()) <= 100 and "…" not in proc.stdout, proc.stdout
    assert "value: median / p99 per call, x = median / best ONNX Runtime median" in proc.stdout
    assert proc.stdout.endswith("\n") and "\r" not in proc.stdout + proc.stderr and "\x1b" not in proc.stdout
    progress = [line for line in proc.stderr.splitlines() if line.strip()]
    assert progress and all(line.startswith(("bench: ", "native library messages: ")) for line in progress), progress


def test_unknown_network_is_one_line_exit_2(tiny_compiled: Path) -> None:
    proc = run_rlopt("bench", str(tiny_compiled), "--network", "critic")
    assert_one_line_error(proc, 2, "networks", "no network 'critic'")


def test_tables_mark_the_fastest_and_list_what_did_not_run() -> None:
    row = CandidateResult(candidate="rlopt tvm", group="rlopt", median_us=1500.0, p99_us=2500.0, mean_us=1600.0,
                          calls=70, ratio_to_ort_best=0.5, gflops_per_s=None, first_call_ms=3.0)
    shape = ShapeBench(point="opt", shape={"input0": [2, 3, 32]}, gflop=None, rounds=10, ort_best=None,
                       results=[row])
    report = BenchReport(created_at="now", model_dir="m", budget_s=1.0, method="m", machine={}, versions={},
                         networks=[NetworkBench(network="policy", eager_source=None, candidates={},
                                                skipped=[Skip(candidate="pytorch eager", reason="needs [the recipe]")],
                                                shapes=[shape])], warnings=["pinned"])
    [table] = bench_tables(report)
    [(cells, _)] = table.rows
    assert cells[1].plain == "rlopt tvm" and cells[1].spans[0].style == "bold green"
    assert cells[2].plain == "1.50 ms" and cells[4].plain == "0.50"
    assert "not run: pytorch eager: needs \\[the recipe]" in table.caption and "WARNING: pinned" in table.caption
