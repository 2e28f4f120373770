"""rlopt.tools.bench.candidates: which candidates run, the eager baseline from --recipe, and why one is skipped."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlopt.manifest import read_manifest
from rlopt.tools.bench import BenchReport
from tests.conftest import assert_one_line_error, run_rlopt, write_tiny_recipe
from tests.tools.common import CORES, ORT_BASELINES, check_shapes, process_alive, runnable_backends, tiny_recipe


def test_cli_json_without_recipe_skips_eager_with_the_reason(ort_compiled: Path) -> None:
    proc = run_rlopt("bench", str(ort_compiled), "--network", "value", "--budget", "0.05", "--no-flops", "--json")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    assert report["kind"] == "rlopt-bench" and report["machine"]["threads"]["usable_cores"] == CORES
    [network] = report["networks"]
    assert network["network"] == "value" and network["eager_source"] is None
    assert [s["gflop"] for s in network["shapes"]] == [None] * 3  # --no-flops
    rlopt_rows = runnable_backends(ort_compiled, "value")
    assert rlopt_rows == {"rlopt onnxruntime"}
    check_shapes(network, rlopt_rows | {"rlopt auto", "torchscript module"} | ORT_BASELINES)
    assert report["isolation"] == "process"
    pids = [w["pid"] for w in network["workers"].values()]
    assert set(network["workers"]) == rlopt_rows | {"rlopt auto", "torchscript module"} | ORT_BASELINES
    assert len(set(pids)) == len(pids) and not [pid for pid in pids if process_alive(pid)]
    assert network["workers"]["rlopt auto"]["backend"] == "onnxruntime"
    assert network["workers"]["onnxruntime 1 thread"]["threads"] == 1
    skipped = {s["candidate"]: s["reason"] for s in network["skipped"]}
    assert "pass --recipe RECIPE" in skipped["pytorch eager"]
    assert "eager" in skipped["torch.compile"]
    assert not [name for name in skipped if name.startswith("rlopt ")], skipped


@pytest.mark.slow  # a bench of every backend in worker processes; the CLI test above runs the same driver
def test_every_backend_and_the_eager_baseline_from_the_recipe(tiny_compiled: Path, policy_bench: BenchReport
                                                              ) -> None:
    [network] = policy_bench.networks
    assert network.eager_source == f"recipe {tiny_recipe(tiny_compiled)}"
    rlopt_rows = runnable_backends(tiny_compiled, "policy")
    assert {"rlopt torchscript", "rlopt onnxruntime", "rlopt tvm"} <= rlopt_rows
    expected = rlopt_rows | {"rlopt auto", "pytorch eager", "torchscript module"} | ORT_BASELINES
    check_shapes(network.model_dump(), expected)
    selected = read_manifest(tiny_compiled).networks["policy"].selected
    assert network.candidates[f"rlopt {selected}"].endswith("(selected by auto)")
    assert network.candidates["pytorch eager"] == f"the nn.Module from recipe {tiny_recipe(tiny_compiled)}"
    skipped = {s.candidate: s.reason for s in network.skipped}
    assert skipped["torch.compile"] == "not requested"
    assert ("rlopt tensorrt" in skipped) == ("rlopt tensorrt" not in rlopt_rows)
    pids = [info.pid for info in network.workers.values()]
    assert set(network.workers) == expected and len(set(pids)) == len(pids)
    assert not [pid for pid in pids if process_alive(pid)]
    # FLOPs are counted (2 * rows * (32*16 + 16*16 + 16*5) for the policy MLP), so GFLOP/s is reported
    assert network.shapes[0].gflop == pytest.approx(2 * 1 * (32 * 16 + 16 * 16 + 16 * 5) / 1e9)
    assert all(r.gflops_per_s and r.gflops_per_s > 0 for r in network.shapes[0].results)
    assert policy_bench.seed is not None and 0 <= policy_bench.seed < 2 ** 31, "a drawn seed, recorded to replay"


def test_a_recipe_for_another_model_is_one_line_exit_2(tiny_compiled: Path, tmp_path: Path) -> None:
    other = write_tiny_recipe(tmp_path, extra="")
    other.write_text(other.read_text().replace("seed: 3", "seed: 4"))
    proc = run_rlopt("bench", str(tiny_compiled), "--recipe", str(other), "--budget", "0.05")
    assert_one_line_error(proc, 2, str(other), "model", "differs from the model MODEL_DIR was compiled from")



@pytest.mark.slow
def test_every_baseline_including_torch_compile(tiny_compiled: Path) -> None:
    proc = run_rlopt("bench", str(tiny_compiled), "--network", "policy", "--recipe", str(tiny_recipe(tiny_compiled)),
                     "--budget", "0.1", "--json")
    assert proc.returncode == 0, proc.stderr
    [network] = json.loads(proc.stdout)["networks"]
    check_shapes(network, runnable_backends(tiny_compiled, "policy")
                 | {"rlopt auto", "pytorch eager", "torchscript module", "torch.compile"} | ORT_BASELINES)

