"""rlopt bench: the candidates, the interleaving, the report's structure. Never a wall-clock threshold."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from rlopt.bench import BLOCK_CALLS, WARMUP_CALLS, run_bench, time_interleaved
from rlopt.manifest import read_manifest
from rlopt.runtime.backends import unavailable_reason
from tests.conftest import assert_one_line_error, run_rlopt, write_tiny_recipe

CORES = len(os.sched_getaffinity(0))
ORT_BASELINES = {"onnxruntime 1 thread"} | ({f"onnxruntime {CORES} threads"} if CORES > 1 else set())


def tiny_recipe(tiny_compiled: Path) -> Path:
    return tiny_compiled.parent / "tiny.yaml"


def runnable_backends(model_dir: Path, network: str) -> set[str]:
    """`rlopt <backend>` for every backend the manifest says is verified and that can run on this machine."""
    record = read_manifest(model_dir).networks[network]
    return {f"rlopt {name}" for name, artifact in record.artifacts.items()
            if artifact.verified and unavailable_reason(name, artifact.facts) is None}


def test_rounds_rotate_blocks_and_drop_a_failing_candidate() -> None:
    order: list[str] = []

    def make(name: str) -> Any:
        return lambda: order.append(name)

    def broken() -> None:
        raise RuntimeError("no C++ compiler\nmore detail")

    calls = {"a": make("a"), "b": make("b"), "c": make("c"), "broken": broken}
    samples, first_ms, failures = time_interleaved(calls, budget_s=0.0, min_rounds=3, max_rounds=3)
    assert failures == {"broken": "RuntimeError: no C++ compiler"}
    assert set(samples) == set(first_ms) == {"a", "b", "c"}
    assert all(s.size == 3 * (BLOCK_CALLS - 1) and (s >= 0).all() for s in samples.values())
    timed = order[3 * WARMUP_CALLS:]
    blocks = [timed[i] for i in range(0, len(timed), BLOCK_CALLS)]
    assert blocks == ["a", "b", "c", "b", "c", "a", "c", "a", "b"]
    assert all(len(set(timed[i:i + BLOCK_CALLS])) == 1 for i in range(0, len(timed), BLOCK_CALLS))


def check_shapes(network: dict[str, Any], expected: set[str]) -> None:
    assert [s["point"] for s in network["shapes"]] == ["min", "opt", "max"]
    for shape in network["shapes"]:
        names = {r["candidate"] for r in shape["results"]}
        assert names == expected, names
        assert shape["rounds"] > 0 and shape["ort_best"] in ORT_BASELINES | {"rlopt onnxruntime"}
        medians = [r["median_us"] for r in shape["results"]]
        assert medians == sorted(medians)
        for row in shape["results"]:
            assert 0 < row["median_us"] <= row["p99_us"] and row["calls"] >= shape["rounds"]
            assert row["ratio_to_ort_best"] > 0
        best = next(r for r in shape["results"] if r["candidate"] == shape["ort_best"])
        assert best["ratio_to_ort_best"] == 1.0


def test_cli_json_without_recipe_skips_eager_with_the_reason(tiny_compiled: Path) -> None:
    proc = run_rlopt("bench", str(tiny_compiled), "--network", "value", "--budget", "0.05", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kind"] == "rlopt-bench" and report["machine"]["threads"]["usable_cores"] == CORES
    [network] = report["networks"]
    assert network["network"] == "value" and network["eager_source"] is None
    rlopt_rows = runnable_backends(tiny_compiled, "value")
    assert {"rlopt torchscript", "rlopt onnxruntime", "rlopt tvm"} <= rlopt_rows
    check_shapes(network, rlopt_rows | {"torchscript module"} | ORT_BASELINES)
    skipped = {s["candidate"]: s["reason"] for s in network["skipped"]}
    assert "pass --recipe RECIPE" in skipped["pytorch eager"]
    assert "eager" in skipped["torch.compile"]
    assert ("rlopt tensorrt" in skipped) == ("rlopt tensorrt" not in rlopt_rows)


def test_eager_baseline_from_the_recipe_reproduces_the_reference(tiny_compiled: Path) -> None:
    report = run_bench(tiny_compiled, "policy", tiny_recipe(tiny_compiled), budget_s=0.05, torch_compile=False)
    [network] = report.networks
    assert network.eager_source == f"recipe {tiny_recipe(tiny_compiled)}"
    check_shapes(network.model_dump(), runnable_backends(tiny_compiled, "policy")
                 | {"pytorch eager", "torchscript module"} | ORT_BASELINES)
    assert {s.candidate: s.reason for s in network.skipped}["torch.compile"] == "not requested"
    # FLOPs are counted (2 * rows * (32*16 + 16*16 + 16*5) for the policy MLP), so GFLOP/s is reported
    assert network.shapes[0].gflop == pytest.approx(2 * 1 * (32 * 16 + 16 * 16 + 16 * 5) / 1e9)
    assert all(r.gflops_per_s and r.gflops_per_s > 0 for r in network.shapes[0].results)


def test_human_table(tiny_compiled: Path) -> None:
    proc = run_rlopt("bench", str(tiny_compiled), "--network", "policy", "--budget", "0.05")
    assert proc.returncode == 0, proc.stderr
    assert "x ORT best" in proc.stdout and "onnxruntime 1 thread" in proc.stdout and "not run:" in proc.stdout


def test_a_recipe_for_another_model_is_one_line_exit_2(tiny_compiled: Path, tmp_path: Path) -> None:
    other = write_tiny_recipe(tmp_path, extra="")
    other.write_text(other.read_text().replace("seed: 3", "seed: 4"))
    proc = run_rlopt("bench", str(tiny_compiled), "--recipe", str(other), "--budget", "0.05")
    assert_one_line_error(proc, 2, str(other), "model", "differs from the model MODEL_DIR was compiled from")


def test_unknown_network_is_one_line_exit_2(tiny_compiled: Path) -> None:
    proc = run_rlopt("bench", str(tiny_compiled), "--network", "critic")
    assert_one_line_error(proc, 2, "networks", "no network 'critic'")


@pytest.mark.slow
def test_every_baseline_including_torch_compile(tiny_compiled: Path) -> None:
    proc = run_rlopt("bench", str(tiny_compiled), "--network", "policy", "--recipe", str(tiny_recipe(tiny_compiled)),
                     "--budget", "0.1", "--json")
    assert proc.returncode == 0, proc.stderr
    [network] = json.loads(proc.stdout)["networks"]
    check_shapes(network, runnable_backends(tiny_compiled, "policy")
                 | {"pytorch eager", "torchscript module", "torch.compile"} | ORT_BASELINES)
