"""The stage cache never lies: keys cover every input, entries are checked on read, misses are explained."""

from __future__ import annotations

from pathlib import Path

from rlopt.compile.cache import StageCache, cache_key, explain_change

COMPONENTS = {"upstream": "abc", "recipe": {"tvm": {"target": {"kind": "llvm"}}},
              "versions": {"onnx": "1.23.2", "tvm": "0.27.0"}}


def _store(cache: StageCache, tmp_path: Path, content: bytes = b"artifact") -> None:
    source = tmp_path / "model.onnx"
    source.write_bytes(content)
    cache.store("onnx", COMPONENTS, {"model.onnx": source}, {"opset": 17})


def test_hit_returns_checked_files_and_facts(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache")
    assert cache.lookup("onnx", COMPONENTS) is None
    _store(cache, tmp_path)
    hit = cache.lookup("onnx", COMPONENTS)
    assert hit is not None and hit.files["model.onnx"].read_bytes() == b"artifact" and hit.facts == {"opset": 17}
    assert cache.info()["entries"] == {"onnx": 1}


def test_any_component_change_is_a_miss(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache")
    _store(cache, tmp_path)
    changed = {**COMPONENTS, "versions": {"onnx": "1.24.0", "tvm": "0.27.0"}}
    assert cache_key(changed) != cache_key(COMPONENTS)
    assert cache.lookup("onnx", changed) is None
    assert cache.lookup("tvm", COMPONENTS) is None, "stages do not share entries"


def test_corrupt_entry_is_a_miss_with_a_warning_and_is_removed(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache")
    _store(cache, tmp_path)
    stored = next((tmp_path / "cache" / "onnx").glob("*/model.onnx"))
    stored.write_bytes(b"artifacT")
    assert cache.lookup("onnx", COMPONENTS) is None
    assert cache.warnings and "corrupt" in cache.warnings[0]
    assert cache.info()["entries"] == {"onnx": 0}
    _store(cache, tmp_path)
    entry = next((tmp_path / "cache" / "onnx").glob("*/entry.json"))
    entry.write_text("{truncated")
    assert cache.lookup("onnx", COMPONENTS) is None


def test_disabled_cache_never_hits_or_writes(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache", enabled=False)
    _store(cache, tmp_path)
    assert cache.lookup("onnx", COMPONENTS) is None and not (tmp_path / "cache").exists()


def test_miss_reasons_name_what_changed(tmp_path: Path) -> None:
    assert explain_change(None, COMPONENTS) == "first compile of this stage"
    newer = {**COMPONENTS, "versions": {"onnx": "1.24.0", "tvm": "0.27.0"}}
    assert explain_change(COMPONENTS, newer) == "onnx 1.23.2 -> 1.24.0"
    retarget = {**COMPONENTS, "recipe": {"tvm": {"target": {"kind": "llvm", "mcpu": "znver4"}}}}
    assert explain_change(COMPONENTS, retarget) == "recipe.tvm.target.mcpu changed"
    assert "upstream" in explain_change(COMPONENTS, {**COMPONENTS, "upstream": "def"})
    source = {**COMPONENTS, "versions": {**COMPONENTS["versions"], "rlopt_source": "a" * 64}}
    assert explain_change(source, {**source, "versions": {**source["versions"], "rlopt_source": "b" * 64}}) == \
        "rlopt_source changed"
    cache = StageCache(tmp_path / "cache")
    cache.remember("tiny/policy", "onnx", COMPONENTS)
    assert cache.explain_miss("tiny/policy", "onnx", newer) == "onnx 1.23.2 -> 1.24.0"


def test_clear(tmp_path: Path) -> None:
    cache = StageCache(tmp_path / "cache")
    _store(cache, tmp_path)
    assert cache.clear() == 1 and not (tmp_path / "cache").exists()


def test_a_cached_stage_declares_every_rlopt_module_its_code_imports() -> None:
    """A cached stage's key holds the source of its module and helpers only: a module its methods import and it
    does not declare (ExportOnnx once left out rlopt.stages.export_onnx) would keep serving outputs of old code."""
    import importlib
    import inspect
    import pkgutil
    import re

    import rlopt
    from rlopt.stages.base import Stage

    for module in pkgutil.walk_packages(rlopt.__path__, "rlopt."):
        if module.name != "rlopt.__main__":
            importlib.import_module(module.name)

    def subclasses(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *subclasses(sub))]

    cached = [cls for cls in subclasses(Stage) if cls.cached]
    assert {"ExportOnnx", "RecordReference", "VerifyBackend", "TvmBuild"} <= {cls.__name__ for cls in cached}
    for cls in cached:
        source = inspect.getsource(cls)
        imported = set(re.findall(r"from (rlopt[\w.]*) import", source))
        assert imported <= {cls.__module__, *cls.helpers}, (cls.__name__, imported - {cls.__module__, *cls.helpers})
