"""Every table a person reads fits 80 and 100 columns with nothing cut: no ellipsis, no word broken across lines,
long details as numbered notes under the table."""

from __future__ import annotations

import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from rich.cells import cell_len
from rich.console import Console

from rlopt.render import parity_failure_table, stage_table, summary_table, verify_table
from rlopt.render.fit import FittedTable

LONG_REASON = ("onnxruntime alone: mixed route not measured (other processes held 1.75 cores through 1 measurements); "
               "onnxruntime threads per shape (the other configuration's latency over the chosen one): 1x1x32 1 thread "
               "1.01x, 2x3x32 1 thread 1.02x, 4x6x32 1 thread 1.06x; not timed: torchscript (over 2x slower "
               "everywhere)")
NAN = "PyTorch's output 'logits' holds NaN at (0, 0, 0, 0) (min, first index = sample): nothing to compare against"
PATH = "/home/someone/projects/agents/artifacts/policy-value-heads"


def render(renderable: object, width: int) -> str:
    console = Console(file=io.StringIO(), width=width, color_system=None, force_terminal=False, legacy_windows=False)
    console.print(renderable)
    return console.file.getvalue()  # type: ignore[attr-defined]


def _stages() -> FittedTable:
    rows = [("policy", "verify onnxruntime", "ok", 0.22, "ok max_abs 5.96e-08; min p50 17us, opt p50 18us, max p50 "
             "20us [cache miss: first compile of this stage]"),
            ("policy", "auto", "ok", 0.93, LONG_REASON),
            ("value", "tensorrt plan", "skipped", 0.0, "no NVIDIA GPU on this machine (/dev/nvidia* absent)"),
            ("value", "onnx", "ok", 1.5, "model.onnx")]
    return stage_table(rows)


def _manifest(tiny_compiled: Path) -> Any:
    from rlopt.manifest import read_manifest

    manifest = read_manifest(tiny_compiled).model_copy(deep=True)
    record = manifest.networks["policy"].artifacts["onnxruntime"]
    assert record.parity is not None
    record.parity.passed = False
    record.parity.outputs[0].passed, record.parity.outputs[0].reason = False, NAN
    return manifest


def _verify(tiny_compiled: Path) -> Any:
    from rlopt.manifest import read_manifest
    from rlopt.verify import Finding, VerifyReport

    parity = read_manifest(tiny_compiled).networks["policy"].artifacts["tvm"].parity
    return VerifyReport(Path(PATH), [
        Finding("", "recipe.yaml", True, "sha256 ok"),
        Finding("policy", "policy/tvm-llvm-2x3x32.so", True, "sha256 ok"),
        Finding("policy", "tvm", True, f"parity ok over {parity.compared if parity else 0} samples", parity),
        Finding("policy", "onnxruntime", False, f"parity FAILED: {NAN}", parity),
        Finding("value", "tensorrt", True, "sha256 ok; parity not re-run here: no NVIDIA GPU on this machine "
                "(/dev/nvidia* absent)")])


def _bench() -> list[FittedTable]:
    from rlopt.render.bench import bench_tables
    from rlopt.tools.bench import BenchReport, CandidateResult, NetworkBench, ShapeBench, Skip

    def row(name: str, median: float) -> CandidateResult:
        return CandidateResult(candidate=name, group="x", median_us=median, p99_us=median * 3, mean_us=median,
                               calls=70, ratio_to_ort_best=median / 100, gflops_per_s=12.5, first_call_ms=180.0)

    shapes = [ShapeBench(point=p, shape={"input0": dims}, gflop=0.1, rounds=40, ort_best="onnxruntime 1 thread",
                         results=[row(c, m) for c, m in [("rlopt auto", 90.0), ("onnxruntime 1 thread", 100.0),
                                                          ("torch.compile", 1500.0), ("pytorch eager", 2400.0)]])
              for p, dims in [("min", [1, 1, 768]), ("opt", [4, 8, 768]), ("max", [8, 16, 768])]]
    skipped = [Skip(candidate="tensorrt", reason="no NVIDIA GPU on this machine (/dev/nvidia* absent)")]
    return bench_tables(BenchReport(created_at="now", model_dir=PATH, budget_s=1.0, method="m", machine={},
                                    versions={}, warnings=["the machine was busy: 1.75 other cores"],
                                    networks=[NetworkBench(network="policy", eager_source=None, candidates={},
                                                           skipped=skipped, shapes=shapes)]))


def _warmup() -> FittedTable:
    from rlopt.render.warmup import report_table
    from rlopt.tools.warmup.schema import ConsistencyReport, LatencySummary, ShapeReport, SloReport, WarmupReport

    summary = LatencySummary(count=100, p50_ms=0.123, p95_ms=0.2, p99_ms=0.456, max_ms=1.0)
    shapes = [ShapeReport(label=label, shapes={"input0": [1]}, share=share, count=1000, first_call_ms=12.5,
                          throughput_rps=950.0, steady_reached=steady, time_to_steady_s=1.25 if steady else None,
                          final_window_p99_ms=0.5, before_steady=summary, after_steady=summary if steady else None,
                          note="" if steady else "no steady state: the last window's p99 is still 2.3x the run's")
              for label, share, steady in [("1x1x768", 0.7, True), ("4x8x768", 0.2, True), ("8x16x768", 0.1, False)]]
    consistency = ConsistencyReport(passed=True, atol=1e-4, probes=["1x1x768"], compared=30, max_abs_diff=0.0,
                                    divergences=[], request_errors=[], detail="30 probes under load matched")
    return report_table(WarmupReport(
        created_at="now", model_dir=PATH, profile="chatbot.json", profile_name="chatbot", network="policy",
        backend="auto", duration_s=5, elapsed_s=5.2, concurrency=4, interrupted=False, load_ms=850.0,
        time_to_steady_s=None, steady_state="not reached", requests=4000, throughput_rps=800.0, shapes=shapes,
        consistency=consistency, slo=SloReport(p99_ms=10.0, measured_p99_ms=0.5, basis="after steady state",
                                              passed=True), passed=True, failures=[], machine={},
        warnings=["other processes held 1.5 cores"], files={}))


def _tune() -> FittedTable:
    from rlopt.backends.tvm.tuning import Task, TuneResult
    from rlopt.render.tune import result_table

    tasks = [Task("fused_matmul1_add1_relu1", None, None, ["policy[input0=1x1x768]", "value[input0=1x1x768]",
                                                           "policy[input0=4x8x768]"], done=64, best_us=12.3),
             Task("fused_matmul2_add21", None, None, ["policy[input0=8x16x768]"], done=64, best_us=40.1)]
    return result_table(TuneResult(Path(PATH + ".tuning/llvm-znver5"), {}, tasks, [], [], 120.0, False, "xgb"))


TABLES: dict[str, Callable[[Path], FittedTable]] = {
    "compile stages": lambda model_dir: _stages(),
    "summary": lambda model_dir: summary_table(_manifest(model_dir)),
    "parity failures": lambda model_dir: parity_failure_table(_manifest(model_dir)),
    "verify": lambda model_dir: verify_table(_verify(model_dir)),
    "bench": lambda model_dir: _bench()[0],
    "warmup": lambda model_dir: _warmup(),
    "tune": lambda model_dir: _tune(),
}


@pytest.mark.parametrize("width", [80, 100])
@pytest.mark.parametrize("name", list(TABLES))
def test_a_table_fits_the_width_and_cuts_nothing(name: str, width: int, tiny_compiled: Path) -> None:
    assert_fits(TABLES[name](tiny_compiled), width)


def assert_fits(table: FittedTable, width: int) -> None:
    """Rendered `width` columns wide: no line wider, no ellipsis, every word of every cell whole on one line, and
    each note's marker in the table with its text under it."""
    out = render(table, width)
    lines = out.splitlines()
    assert max(cell_len(line) for line in lines) <= width, out
    assert "…" not in out, out
    words = {word for row, _ in table.rows for cell in row for word in cell.plain.split() if len(word) >= 3}
    broken = sorted(w for w in words if not any(w in line for line in lines))
    assert broken == [], f"words broken across lines: {broken}\n{out}"
    _, notes = table.layout(width)
    for number, note in enumerate(notes, 1):
        marker = f"[{number}]"
        assert any(marker in line and not line.startswith(marker) for line in lines), (marker, out)
        assert any(line.startswith(f"{marker} {note.plain[:20]}") for line in lines), (marker, out)


def test_long_details_become_notes_and_short_ones_stay() -> None:
    out = render(_stages(), 100)
    assert f"\n[1] {LONG_REASON[:40]}" in out and "[2]" not in out, out
    table_part = out.split("\n[1] ")[0]
    assert "│ model.onnx" in table_part and "[1]" in table_part, "a short detail stays in its cell"


def test_user_text_is_shown_as_is_not_read_as_markup() -> None:
    out = " ".join(render(_tune(), 100).split())
    assert "policy[input0=1x1x768], value[input0=1x1x768]" in out, out


def test_the_warmup_title_says_whether_steady_state_was_reached() -> None:
    out = render(_warmup(), 100)
    assert "steady state not reached" in " ".join(out.split()) and "steady state at not" not in out
