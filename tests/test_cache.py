"""The stage cache never lies: keys cover every input, entries are checked on read, misses are explained."""

from __future__ import annotations

import functools
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


# Modules a cached stage may reach without their source being part of its key: none of them computes an output.
KEY_NEUTRAL = {
    "rlopt.errors": "the message of a failure, and a failure is never cached",
    "rlopt.lazy": "imports modules by name",
    "rlopt.stages.base": "the Stage interface, its Context and StageOutput",
    "rlopt.manifest": "file hashes, atomic writes and record schemas; a cached record is validated on read",
    "rlopt.files": "file hashes and records, paths confined to MODEL_DIR",
    "rlopt.machine": "facts about this machine; a machine-dependent stage's key holds the machine's identity",
}
# (stage, module) pairs whose code is in the key another way, or reached only where the stage is not cached
UNCACHED_PATHS = {
    ("TvmBuild", "rlopt.backends.tvm.tuning"): "tunes only with tune_trials > 0, when TvmBuild.cacheable is False",
    ("TvmBuild", "rlopt.backends.tvm.measuring"): "the same tuning path",
    ("TvmBuild", "rlopt.backends.tvm.builder"): "the same tuning path",
    ("OpenVinoConvert", "rlopt.backends.base"): "module_missing: whether OpenVINO imports here (a skip, not cached)",
}


@functools.lru_cache(maxsize=None)
def _names_used(function: object) -> frozenset[object]:
    """The rlopt functions, classes and modules that `function`'s code names (type annotations left out), through
    its module's globals and its own function-level imports."""
    import ast
    import importlib
    import inspect
    import textwrap
    import types

    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))  # type: ignore[arg-type]
    except (OSError, TypeError):
        return set()
    names: dict[str, object] = dict(getattr(function, "__globals__", {}))
    annotations: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("rlopt"):
            module = importlib.import_module(node.module)
            for alias in node.names:
                names[alias.asname or alias.name] = getattr(module, alias.name, None) or \
                    importlib.import_module(f"{node.module}.{alias.name}")
        notes = [node.annotation] if isinstance(node, (ast.arg, ast.AnnAssign)) else []
        notes += [node.returns] if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        annotations.update(id(inner) for note in notes if note is not None for inner in ast.walk(note))
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Name) and id(node) not in annotations:
            target = names.get(node.id)
            module = target.__name__ if isinstance(target, types.ModuleType) else getattr(target, "__module__", "")
            if str(module).startswith("rlopt") and (inspect.isfunction(target) or inspect.isclass(target)
                                                     or isinstance(target, types.ModuleType)):
                found.add(target)
    return frozenset(found)


def _reached_modules(stage: type) -> dict[str, str]:
    """Every rlopt module whose code `stage` can run: the functions and classes its methods name, and theirs, to the
    end; a runner opened through the registry (`open_runner`) reaches every registered runner class. Module ->
    the first function found to reach it."""
    import inspect
    import types

    from rlopt.backends import BACKENDS, open_runner
    from rlopt.stages.base import Stage

    reached: dict[str, str] = {}
    seen: set[object] = set()
    todo: list[tuple[object, str]] = [(stage, stage.__name__)]
    while todo:
        item, via = todo.pop()
        if item in seen:
            continue
        seen.add(item)
        if isinstance(item, types.ModuleType):
            reached.setdefault(item.__name__, via)
            continue
        reached.setdefault(item.__module__, via)  # type: ignore[attr-defined]
        if item is open_runner:
            todo += [(b.runner_class(), f"{via} (open_runner)") for b in BACKENDS.values()]
        if inspect.isclass(item):
            if item is Stage:
                continue
            members = [m.__func__ if isinstance(m, (classmethod, staticmethod)) else
                       m.fget if isinstance(m, property) else m for m in vars(item).values()]
            functions = [m for m in members if inspect.isfunction(m)]
        else:
            functions = [item]
        for function in functions:
            todo += [(used, f"{function.__module__}.{function.__qualname__}") for used in _names_used(function)
                     if used not in seen]
    return reached


def test_a_cached_stage_key_covers_every_rlopt_module_its_code_can_run() -> None:
    """A cached stage's key holds the source of its module and helpers only: code it runs in a module it does not
    declare (ExportOnnx once left out rlopt.stages.export_onnx; the verify stage's latency came from rlopt.timing)
    would keep serving outputs of old code. Followed through every function it calls, not only its class body."""
    import importlib
    import pkgutil

    import rlopt
    from rlopt.stages.base import Stage

    for module in pkgutil.walk_packages(rlopt.__path__, "rlopt."):
        if module.name != "rlopt.__main__":
            importlib.import_module(module.name)

    def subclasses(cls: type) -> list[type]:
        return [c for sub in cls.__subclasses__() for c in (sub, *subclasses(sub))]

    cached = [cls for cls in subclasses(Stage) if cls.cached]
    assert {"ExportOnnx", "RecordReference", "VerifyBackend", "TimeBackends", "TvmBuild"} <= {cls.__name__ for cls in cached}
    missing = {}
    from rlopt.backends import BACKENDS

    # VerifyBackend's, TimeBackends' and ChooseAuto's keys hold package_digest of each backend's runner package
    # (`runner_code`); TimeBackends' and ChooseAuto's also the runtime package's (`runtime`)
    runner_packages = tuple(b.runner.partition(":")[0].rpartition(".")[0] + "." for b in BACKENDS.values())
    for cls in cached:
        keyed = {cls.__module__, *cls.helpers, *KEY_NEUTRAL}
        for module, via in _reached_modules(cls).items():
            if cls.__name__ in ("VerifyBackend", "TimeBackends", "ChooseAuto") and module.startswith(runner_packages):
                continue
            if cls.__name__ in ("TimeBackends", "ChooseAuto") and module.startswith("rlopt.runtime."):
                continue
            if module not in keyed and (cls.__name__, module) not in UNCACHED_PATHS:
                missing[f"{cls.__name__}: {module}"] = via
    assert missing == {}, "declare these in the stage's helpers (module: the function that reaches it)"
