"""The stage cache inside a real compile: hits on an unchanged recipe, explained misses, corrupt entries rebuilt."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlopt.compile.cache import StageCache
from rlopt.manifest import read_manifest
from rlopt.compile import CompileResult, compile_recipe
from rlopt.verify import verify_model_dir
from tests.conftest import run_rlopt, write_tiny_recipe

CACHED = ("reference", "onnx", "tvm", "verify torchscript", "verify onnxruntime", "verify tvm", "latency", "auto")


def _outcomes(model_dir: Path, network: str = "policy") -> dict[str, str]:
    return {s["stage"]: s.get("cache", "") for s in read_manifest(model_dir).networks[network].stages}


@pytest.fixture(scope="module")
def cold(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, CompileResult]:
    """(recipe, cache, result) of a first compile into an empty stage cache; tests copy the cache to change it."""
    folder = tmp_path_factory.mktemp("cold")
    recipe = write_tiny_recipe(folder, backends="[torchscript, onnxruntime, tvm]")
    result = compile_recipe(recipe, folder / "out", cache=StageCache(folder / "cache"))
    assert result.passed and all(_outcomes(folder / "out")[s].startswith("miss") for s in CACHED)
    return recipe, folder / "cache", result


def test_warm_compile_hits_every_cached_stage_and_stays_correct(cold: tuple[Path, Path, CompileResult],
                                                                tmp_path: Path) -> None:
    recipe, cache, first = cold
    warm = compile_recipe(recipe, tmp_path / "out", cache=StageCache(cache))
    assert warm.passed
    outcomes = _outcomes(tmp_path / "out")
    assert all(outcomes[s] == "hit" for s in CACHED), outcomes
    assert verify_model_dir(tmp_path / "out").passed
    before = read_manifest(tmp_path / "out").networks["policy"].artifacts
    assert before["tvm"].sha256 == first.manifest.networks["policy"].artifacts["tvm"].sha256
    for name, network in read_manifest(tmp_path / "out").networks.items():
        assert network.facts.route == first.manifest.networks[name].facts.route, "the cached route, as measured"


def test_retime_measures_the_routes_again_and_the_next_warm_compile_reuses_the_new_ones(
        cold: tuple[Path, Path, CompileResult], tmp_path: Path) -> None:
    recipe, cache, first = cold
    shutil.copytree(cache, tmp_path / "cache")
    retimed = compile_recipe(recipe, tmp_path / "retimed", cache=StageCache(tmp_path / "cache"), retime=True)
    outcomes = _outcomes(tmp_path / "retimed")
    assert retimed.passed and outcomes["auto"] == outcomes["latency"] == "refreshed (--retime)"
    assert all(outcomes[s] == "hit" for s in CACHED if s not in ("auto", "latency")), outcomes
    measured = retimed.manifest.networks["policy"].facts.route
    assert measured is not None and measured.choice is not None
    assert measured.choice.measured_at >= first.manifest.networks["policy"].facts.route.choice.measured_at
    again = compile_recipe(recipe, tmp_path / "again", cache=StageCache(tmp_path / "cache"))
    assert _outcomes(tmp_path / "again")["auto"] == "hit"
    assert again.manifest.networks["policy"].facts.route == measured, "the refreshed entry replaced the old one"


@pytest.mark.slow  # a second full compile; the miss reasons are unit-tested in tests/test_cache.py
def test_a_changed_recipe_field_misses_with_the_reason(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache")
    recipe = write_tiny_recipe(tmp_path, backends="[onnxruntime]")
    compile_recipe(recipe, tmp_path / "out", cache=cache)
    recipe.write_text(recipe.read_text().replace("samples: 4", "samples: 3"))
    compile_recipe(recipe, tmp_path / "out", cache=cache)
    outcomes = _outcomes(tmp_path / "out")
    assert outcomes["reference"] == "miss: verify.samples changed"
    assert outcomes["onnx"] == "hit", "the ONNX export does not depend on verify.samples"
    recipe.write_text(recipe.read_text().replace("seed: 3", "seed: 4"))
    compile_recipe(recipe, tmp_path / "out", cache=cache)
    assert _outcomes(tmp_path / "out")["onnx"] == "miss: model weights changed", "the export bakes the weights"


def test_corrupt_entry_is_rebuilt_with_a_warning(cold: tuple[Path, Path, CompileResult], tmp_path: Path) -> None:
    """One flipped byte in one network's TVM entry: that stage is rebuilt, the other network's still hits."""
    recipe, cache, _ = cold
    shutil.copytree(cache, tmp_path / "cache")
    entries = sorted(d for d in (tmp_path / "cache" / "tvm").iterdir() if d.is_dir())
    assert len(entries) == 2, entries  # one per network
    library = sorted(entries[0].glob("*.so"))[0]
    data = bytearray(library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    library.write_bytes(bytes(data))
    result = compile_recipe(recipe, tmp_path / "out", cache=StageCache(tmp_path / "cache"))
    assert result.passed and any("corrupt" in w for w in result.warnings)
    outcomes = sorted(_outcomes(tmp_path / "out", network)["tvm"] for network in ("policy", "value"))
    assert outcomes[0] == "hit" and outcomes[1].startswith("miss"), outcomes
    assert verify_model_dir(tmp_path / "out").passed


@pytest.mark.slow  # CLI compiles or runs in fresh processes: `make test-all`
def test_no_cache_flag_and_cache_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RLOPT_CACHE", str(tmp_path / "private-cache"))
    recipe = write_tiny_recipe(tmp_path, backends="[onnxruntime]")
    proc = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "out"), "--no-cache")
    assert proc.returncode == 0, proc.stderr
    assert _outcomes(tmp_path / "out")["onnx"] == "off (--no-cache)"
    first = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "out"))
    second = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "out"))
    assert first.returncode == second.returncode == 0
    assert "[cache miss: first compile of this stage]" in first.stdout, "the summary shows the outcome verbatim"
    assert "[cache hit]" in second.stdout
    retimed = run_rlopt("compile", str(recipe), "-o", str(tmp_path / "out"), "--retime")
    assert retimed.returncode == 0 and _outcomes(tmp_path / "out")["auto"] == "refreshed (--retime)"
    inspected = run_rlopt("inspect", str(tmp_path / "out"))
    assert inspected.returncode == 0 and "auto measured " in inspected.stdout
    info = run_rlopt("cache", "info", "--json")
    assert info.returncode == 0 and '"entries"' in info.stdout
    assert run_rlopt("cache", "clear").returncode == 0
