"""Which tuning database a TVM build applies: the CPU's own, else one tuned on a CPU with the same vector features,
else another CPU's, borrowed."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from rlopt.backends.tvm import database
from rlopt.backends.tvm.database import SCHEDULE_FEATURES, choose_database

RECIPES = Path(__file__).resolve().parents[2] / "recipes"
AVX512 = frozenset({"avx", "avx2", "fma", "avx512f", "avx512bw", "avx512dq", "avx512vl"})


@pytest.mark.parametrize("recipe", ["policy_value_heads.yaml", "ppo_mlp.yaml", "atari_cnn.yaml"])
@pytest.mark.parametrize("host", ["znver4", "znver5"])
def test_the_shipped_databases_apply_on_both_cpu_names_seen_here(recipe: str, host: str) -> None:
    pytest.importorskip("tvm")
    choice = choose_database(RECIPES / recipe, {"kind": "llvm", "mcpu": host, "num-cores": 2})
    assert choice.found and choice.directory == RECIPES / recipe.replace(".yaml", ".tuning") / "llvm-znver5"
    assert ("tuned for llvm-znver5" == choice.reason) if host == "znver5" else \
        choice.reason.startswith("tuned on znver5, which has the same vector features as znver4")


def test_llvm_gives_znver4_znver5_and_icelake_server_the_same_schedule_features() -> None:
    pytest.importorskip("tvm")
    assert database.schedule_features("znver4") == database.schedule_features("znver5") == \
        database.schedule_features("icelake-server") == AVX512
    assert database.schedule_features("haswell") == frozenset({"avx", "avx2", "fma"})


def _tuning(tmp_path: Path, *mcpus: str) -> Path:
    recipe = tmp_path / "net.yaml"
    recipe.write_text("name: net\n")
    for mcpu in mcpus:
        folder = tmp_path / "net.tuning" / f"llvm-{mcpu}"
        folder.mkdir(parents=True)
        (folder / "meta.json").write_text(json.dumps({"target": {"kind": "llvm", "mcpu": mcpu}}))
    return recipe


def _features(table: dict[str, frozenset[str]]) -> object:
    return lambda mcpu: table[mcpu] & SCHEDULE_FEATURES


def test_the_exact_cpu_name_wins_over_a_compatible_one(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "schedule_features", _features({"a": AVX512, "b": AVX512}))
    recipe = _tuning(tmp_path, "a", "b")
    choice = choose_database(recipe, {"kind": "llvm", "mcpu": "b"})
    assert choice.found and choice.directory.name == "llvm-b" and choice.reason == "tuned for llvm-b"


def test_a_cpu_without_the_databases_vector_features_borrows_them_and_says_so(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "schedule_features",
                        _features({"zen5": AVX512, "haswell": frozenset({"avx", "avx2", "fma"})}))
    recipe = _tuning(tmp_path, "zen5")
    choice = choose_database(recipe, {"kind": "llvm", "mcpu": "haswell"})
    assert choice.found and choice.borrowed and choice.directory.name == "llvm-zen5"
    assert choice.reason == ("no database for llvm-haswell; borrowed the schedules tuned on zen5 (zen5 has avx512bw, "
                             "avx512dq, avx512f, avx512vl where haswell differs): run 'rlopt tune' on this CPU for "
                             "its own")


def test_the_borrowed_database_is_the_one_sharing_most_vector_features(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    avx2 = frozenset({"avx", "avx2", "fma"})
    monkeypatch.setattr(database, "schedule_features", _features(
        {"a-neon": frozenset({"neon"}), "b-zen5": AVX512, "c-haswell": avx2, "zen2": avx2 | {"avx512f"}}))
    choice = choose_database(_tuning(tmp_path, "a-neon", "b-zen5", "c-haswell"), {"kind": "llvm", "mcpu": "zen2"})
    assert choice.borrowed and choice.directory.name == "llvm-b-zen5"  # shares 4 of zen2's features; haswell 3


def test_an_exact_or_same_feature_database_is_not_borrowed(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(database, "schedule_features", _features({"a": AVX512, "b": AVX512}))
    recipe = _tuning(tmp_path, "a")
    assert not choose_database(recipe, {"kind": "llvm", "mcpu": "b"}).borrowed
    assert not choose_database(recipe, {"kind": "llvm", "mcpu": "a"}).borrowed


def test_no_database_at_all_says_so(tmp_path: Path) -> None:
    choice = choose_database(_tuning(tmp_path), {"kind": "llvm", "mcpu": "znver4"})
    assert not choice.found and choice.reason == "no database for llvm-znver4"
