"""scripts/bench_refit.py's latency verdict: refitted / fresh1 must lie within the two fresh compiles' spread."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from bench_refit import files_unlike, latency_verdicts, same_bytes  # noqa: E402


def _rounds(refitted: list[float], fresh1: list[float], fresh2: list[float]) -> list[dict[str, list[float]]]:
    """One run's per-round medians of the three candidates."""
    return [{"refitted tvm": refitted, "fresh1 tvm": fresh1, "fresh2 tvm": fresh2}]


def test_a_refit_between_the_two_fresh_compiles_is_within() -> None:
    (row,) = latency_verdicts(_rounds([10.5, 21.0, 10.5], [10.0, 20.0, 10.0], [11.0, 22.0, 11.0]), ["tvm"])
    assert row["refit_over_fresh1"] == 1.05 and row["fresh2_over_fresh1"] == 1.1 and row["verdict"] == "within"
    assert row["fresh1_us"] == 10.0


def test_a_refit_slower_than_both_fresh_compiles_is_outside() -> None:
    (row,) = latency_verdicts(_rounds([12.0, 12.0], [10.0, 10.0], [9.0, 9.0]), ["tvm"])  # 1.2 > 1.0 x 1.05
    assert row["refit_over_fresh1"] == 1.2 and row["fresh2_over_fresh1"] == 0.9 and row["verdict"] == "outside"


def test_a_refit_just_outside_the_spread_is_within_the_protocols_tolerance() -> None:
    (row,) = latency_verdicts(_rounds([10.3, 10.3], [10.0, 10.0], [10.1, 10.1]), ["tvm"])
    assert row["refit_over_fresh1"] == 1.03 and row["verdict"] == "within 5%"


def test_a_backend_without_timings_names_the_missing_candidate() -> None:
    (row,) = latency_verdicts([{"refitted tvm": [1.0], "fresh1 tvm": [1.0], "fresh2 tvm": []}], ["tvm"])
    assert row == {"backend": "tvm", "verdict": "not measured: no timings of fresh2 tvm"}


def test_one_stalled_run_moves_its_ratio_but_not_the_median_over_runs() -> None:
    """Runs are fresh processes: a refitted process that ran at one-thread speed in one run is one run of three."""
    runs = [*_rounds([10.0, 10.0], [10.0, 10.0], [10.2, 10.2]), *_rounds([17.0, 17.0], [10.0, 10.0], [10.1, 10.1]),
            *_rounds([10.1, 10.1], [10.0, 10.0], [10.3, 10.3])]
    (row,) = latency_verdicts(runs, ["tvm"])
    assert row["refit_over_fresh1_runs"] == [1.0, 1.7, 1.01] and row["refit_over_fresh1"] == 1.01
    assert row["fresh2_over_fresh1"] == 1.02 and row["verdict"] == "within"
    (alone,) = latency_verdicts(runs[1:2], ["tvm"])
    assert alone["verdict"] == "outside"


def test_the_files_unlike_a_fresh_compile_are_named_by_sha256_with_what_loads_with_the_artifact(
        tiny_compiled: Path) -> None:
    from rlopt.backends.tvm.facts import TvmFacts
    from rlopt.manifest import read_manifest

    refitted = read_manifest(tiny_compiled)
    fresh = refitted.model_copy(deep=True)
    assert files_unlike({"refitted": refitted, "fresh1": fresh}, "policy", "tvm") == []
    tvm = fresh.networks["policy"].artifacts["tvm"]
    params = TvmFacts.of(tvm.facts).params
    assert params is not None
    tvm.facts = tvm.facts.updated(params=params.updated(file=params.file.model_copy(update={"sha256": "0" * 64})))
    fresh.networks["policy"].artifacts["onnxruntime"].sha256 = "1" * 64
    assert files_unlike({"refitted": refitted, "fresh1": fresh}, "policy", "tvm") == [Path(params.file.path).name]
    assert files_unlike({"refitted": refitted, "fresh1": fresh}, "policy", "onnxruntime") == ["model.onnx"]
    assert files_unlike({"refitted": refitted, "fresh1": fresh}, "policy", "torchscript") == []
    at_min = files_unlike({"refitted": refitted, "fresh1": fresh}, "policy", "tvm", "min")
    assert at_min == [Path(params.file.path).name], "the point's own library and the params, not the dynamic one"
    fresh.networks["policy"].artifacts["tvm"].sha256 = "2" * 64
    assert files_unlike({"refitted": refitted, "fresh1": fresh}, "policy", "tvm", "min") == at_min
    tvm.facts = tvm.facts.updated(num_threads=7, thread_latency_us={"1x1x32": {"1": 1.0}})
    assert files_unlike({"refitted": refitted, "fresh1": fresh}, "policy", "tvm", "min") == [*at_min, "facts.num_threads"]


def test_a_row_whose_files_equal_the_fresh_compiles_is_same_bytes_whatever_its_timing() -> None:
    (row,) = latency_verdicts(_rounds([20.0, 20.0, 20.0], [10.0, 10.0, 10.0], [10.0, 10.0, 10.0]), ["tvm"])
    assert row["verdict"] == "outside"
    assert same_bytes(row, [])["verdict"] == "same bytes" and same_bytes(row, [])["timing_verdict"] == "outside"
    assert same_bytes(row, ["model.ts"])["verdict"] == "outside"
