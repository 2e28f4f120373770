"""Helpers shared by the bench and warmup tests (the tiny MODEL_DIR of tests/conftest.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from rlopt.manifest import read_manifest
from rlopt.backends import unavailable_reason

CORES = len(os.sched_getaffinity(0))
ORT_BASELINES = {"onnxruntime 1 thread"} | ({f"onnxruntime {CORES} threads"} if CORES > 1 else set())

TINY_PROFILE = {
    "network": "policy",
    "requests": [
        {"weight": 0.7, "shapes": {"input0": [1, 1, 32]}},
        {"weight": 0.2, "shapes": {"input0": [2, 3, 32]}},
        {"weight": 0.1, "shapes": {"input0": [4, 6, 32]}},
    ],
    "duration_s": 1,
    "concurrency": 2,
}


def write_profile(folder: Path, document: Any, name: str = "tiny.json") -> Path:
    path = folder / name
    path.write_text(document if isinstance(document, str) else json.dumps(document))
    return path


def with_changes(**changes: Any) -> dict[str, Any]:
    return json.loads(json.dumps(TINY_PROFILE)) | changes


def tiny_recipe(tiny_compiled: Path) -> Path:
    return tiny_compiled.parent / "tiny.yaml"


def runnable_backends(model_dir: Path, network: str) -> set[str]:
    """`rlopt <backend>` for every backend the manifest says is verified and that can run on this machine."""
    record = read_manifest(model_dir).networks[network]
    return {f"rlopt {name}" for name, artifact in record.artifacts.items()
            if artifact.verified and unavailable_reason(name, artifact.facts) is None}


def run_piped(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The real CLI with stdout and stderr piped and no COLUMNS: what a CI log or `| tee` sees."""
    env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES", "FORCE_COLOR", "TTY_COMPATIBLE")}
    return subprocess.run([sys.executable, "-m", "rlopt", *args], check=False, capture_output=True, text=True,
                          timeout=timeout, env=env, stdin=subprocess.DEVNULL)


def check_shapes(network: dict[str, Any], expected: set[str]) -> None:
    """Every profile point, every expected candidate, fastest first, ratios to the best ONNX Runtime."""
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



# ---------------------------------------------------------------------------------------------------- processes


def process_state(pid: int) -> str | None:
    """'R', 'S', 'T' (stopped: a frozen worker), 'Z'...; None when there is no such process."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return None


def process_alive(pid: int) -> bool:
    """Running or stopped; a zombie (exited, not yet reaped by whoever adopted it) counts as gone."""
    return process_state(pid) not in (None, "Z")


def children_of(pid: int) -> set[int]:
    found = set()
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid and fields[0] != "Z":
                found.add(int(entry.name))
    return found


needs_proc = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="reads processes from /proc")

