"""Exit 3 for internal errors, `rlopt schema`, `rlopt cache prune`."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from rlopt.cli import main
from tests.conftest import run_rlopt


def test_an_internal_error_is_one_line_exit_3_with_the_traceback_in_a_log(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("RLOPT_CACHE", str(tmp_path / "cache"))

    def broken(_: object) -> object:
        raise KeyError("a bug\nover two lines")

    monkeypatch.setattr("rlopt.manifest.read_manifest", broken)
    with pytest.raises(SystemExit) as exited:
        main(["inspect", str(tmp_path)])
    assert exited.value.code == 3
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("rlopt: internal error (a bug in rlopt): KeyError: ")
    log = Path(err.rsplit("the traceback is in ", 1)[1].strip())
    assert log.parent == tmp_path / "cache" / "logs" and "Traceback" in log.read_text()


def test_the_cache_directory_follows_xdg(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from rlopt.machine import cache_root

    monkeypatch.delenv("RLOPT_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cache_root() == tmp_path / "rlopt"
    monkeypatch.setenv("RLOPT_CACHE", str(tmp_path / "mine"))
    assert cache_root() == tmp_path / "mine"


def test_a_user_error_is_never_exit_3(tmp_path: Path) -> None:
    proc = run_rlopt("inspect", str(tmp_path / "missing"))
    assert proc.returncode == 2 and "internal error" not in proc.stderr


@pytest.mark.parametrize("kind, field", [("recipe", "networks"), ("profile", "requests"), ("manifest", "schema_version")])
def test_schema_prints_the_json_schema(kind: str, field: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["schema", kind])
    assert exited.value.code in (0, None)
    assert field in json.loads(capsys.readouterr().out)["properties"]


def test_schema_of_an_unknown_kind_is_a_usage_error(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["schema", "bogus"])
    assert exited.value.code == 2 and "recipe, profile, manifest" in capsys.readouterr().err


def test_cache_prune_removes_entries_of_other_code_or_versions(tmp_path: Path) -> None:
    from rlopt.backends import stage_versions
    from rlopt.compile.cache import StageCache
    from rlopt.compile.network import entry_is_current, stage_code_versions

    versions = stage_code_versions()
    cache = StageCache(tmp_path)
    current = {"code": versions["onnx"], "versions": stage_versions(), "config": 1}
    cache.store("onnx", current, {}, {})
    cache.store("onnx", {**current, "code": "old"}, {}, {})
    tvm = {"code": versions["verify"], "backend": "tvm", "versions": stage_versions("tvm")}
    cache.store("verify tvm", {**tvm, "versions": {**stage_versions("tvm"), "onnx": "0.0"}}, {}, {})
    cache.store("verify onnxruntime", {"code": versions["verify"], "backend": "onnxruntime",
                                       "versions": stage_versions("onnxruntime")}, {}, {})
    cache.store("verify openvino", {"code": versions["verify"], "backend": "openvino",
                                    "versions": stage_versions()}, {}, {})  # keyed before its library was declared
    assert cache.prune(lambda stage, c: entry_is_current(stage, c, versions)) == 3
    assert cache.info()["entries"] == {"onnx": 1, "verify onnxruntime": 1, "verify tvm": 0, "verify openvino": 0}
    assert cache.lookup("onnx", current) is not None


def test_cache_prune_command(tmp_path: Path) -> None:
    proc = run_rlopt("cache", "prune", "--json")
    assert proc.returncode == 0, proc.stderr
    assert isinstance(json.loads(proc.stdout)["removed"], int)


@pytest.mark.parametrize(("argv", "own_entry", "applied"), [
    (["rlopt", "verify", "MISSING"], True, True), (["rlopt", "refit", "MISSING", "--checkpoint", "c.pt"], True, True),
    (["rlopt", "inspect", "MISSING"], True, False), (["rlopt", "verify", "MISSING"], False, False)])
def test_only_the_processs_own_run_only_command_loads_runtimes_alone(
        argv: list[str], own_entry: bool, applied: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`rlopt refit / verify / warmup` as the process's entry load TVM's runtime alone; an in-process call with
    argv (a test, a user's script) must leave its process able to compile."""
    calls: list[bool] = []
    monkeypatch.setattr("rlopt.backends.runtime_only_process", lambda: calls.append(True) or [])
    monkeypatch.setattr("sys.argv", [argv[0], *[str(tmp_path / a) if a == "MISSING" else a for a in argv[1:]]])
    with pytest.raises(SystemExit) as exited:
        main() if own_entry else main(sys.argv[1:])
    assert exited.value.code == 2, "a missing MODEL_DIR is a usage error"
    assert calls == ([True] if applied else [])
