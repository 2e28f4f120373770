"""scripts/bench.py's helpers: issue 5's targets as shares of the roofs (bench_doc), the roofline probe (bench_limits), the
tuning column (bench_models); the batch-1 call path's breakdown (bench_callpath)."""

from __future__ import annotations

import math
import shutil
import sys
from pathlib import Path
from typing import Any

import pytest


def _bench_script(name: str = "bench_limits") -> Any:
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"rlopt_{name}", Path(__file__).parents[2] / "scripts" / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_target_needs_reads_a_target_as_shares_of_the_machines_roofs() -> None:
    script = _bench_script("bench_doc")
    # opt: 0.6 x 100 us = 60 us; 0.03 GFLOP in 60 us = 500 GFLOP/s = 125% of a 400 GFLOP/s peak
    assert script.target_needs("opt", 100.0, 0.03, 400.0) == "60.0 us (125% of FMA peak)"
    assert script.target_needs("min", 10.0, None, None) == "3.5 us"
    assert script.target_needs("extra", 10.0, 0.1, 400.0) == "-"  # shapes without a target


@pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler to build scripts/roofline.c")
def test_roofline_builds_and_reports_a_peak_and_cache_read_times(tmp_path: Path) -> None:
    """The probe compiles and answers with figures; how fast this machine is belongs to the bench, not to a test."""
    script = _bench_script()
    roofline = script.Roofline(tmp_path)
    assert roofline.binary is not None, roofline.reason
    peak, small, large = roofline.peak_gflops(1), roofline.read_us(64 * 1024), roofline.read_us(1024 * 1024)
    assert all(isinstance(v, float) and math.isfinite(v) and v > 0 for v in (peak, small, large)), (peak, small, large)


def test_roofline_without_a_compiler_says_why(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _bench_script()
    monkeypatch.setenv("CC", "no-such-compiler-here")
    roofline = script.Roofline(tmp_path)
    assert roofline.binary is None and "no C compiler" in roofline.reason
    assert roofline.peak_gflops(2) is None and roofline.read_us(1024) is None


def _manifest_with(folder: Path, databases: list[dict[str, Any] | None]) -> Path:
    import json

    networks = {f"n{i}": {"artifacts": {"tvm": {"facts": {"database": db}}}} for i, db in enumerate(databases)}
    folder.mkdir()
    (folder / "manifest.json").write_text(json.dumps({"networks": networks}))
    return folder


def test_the_tuning_column_reads_what_the_tvm_builds_applied(tmp_path: Path) -> None:
    tuning_applied = _bench_script("bench_models").tuning_applied
    own = {"dir": "r.tuning/llvm-znver5", "found": True, "borrowed": False}
    borrowed = {"dir": "r.tuning/llvm-znver5", "found": True, "borrowed": True}
    missing = {"dir": "r.tuning/llvm-znver2", "found": False, "borrowed": False}
    assert tuning_applied(_manifest_with(tmp_path / "a", [own, own])) == "yes"
    assert tuning_applied(_manifest_with(tmp_path / "b", [borrowed, borrowed])) == "borrowed from znver5"
    assert tuning_applied(_manifest_with(tmp_path / "c", [own, missing])) == "no"
    assert tuning_applied(_manifest_with(tmp_path / "d", [None])) == "no"
    assert tuning_applied(tmp_path / "absent") == "no"


def test_the_call_path_breakdown_times_every_layer_down_to_each_kernel(tiny_compiled: Path, tmp_path: Path,
                                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CC", "no-such-compiler-here")  # the roofs are scripts/roofline.c's test's
    script = _bench_script("bench_callpath")
    result = script.breakdown(tiny_compiled, "policy", 2, 3, script.Roofline(tmp_path))
    layers = result["layers"]
    kernels = [name for name in layers if name.startswith("tvm kernel ")]
    # the tiny policy 32 -> 16 -> 16 -> 5: each kernel reads its weight and bias (fp32); obs[0] is not a kernel
    assert [result["weight_bytes"][name] for name in kernels] == [(32 * 16 + 16) * 4, (16 * 16 + 16) * 4,
                                                                   (16 * 5 + 5) * 4]
    assert [name.split("(")[-1] for name in layers if name.startswith("numpy")] == ["1x32 @ 32x16)", "1x16 @ 16x16)",
                                                                                  "1x16 @ 16x5)"]
    assert {"tvm: Session.run", "tvm bound call", "tvm kernels alone"} <= set(layers)
    assert all(figures["min_us"] > 0 for figures in layers.values())
    assert result["roof_read_us"] == {1: None, 2: None} or result["roof_read_us"] == {1: None}
    text = script.render(result)
    assert "tvm kernels alone" in text and "Session layer" in text
