"""Without the openvino module (simulated: None in sys.modules, as Python treats a module that cannot be imported):
the backend is skipped with the install line, and every other backend of the recipe goes on. Runs with or without
OpenVINO installed."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from rlopt.backends import unavailable_reason
from rlopt.backends.openvino import library
from rlopt.errors import BackendUnavailable
from tests.conftest import write_tiny_recipe

REASON = "python module 'openvino' is not installed; fix: pip install 'rlopt[openvino]'"


@pytest.fixture()
def no_openvino(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "openvino", None)
    monkeypatch.setattr(library, "_core", None)


def test_every_module_of_the_package_imports_without_openvino() -> None:
    import subprocess

    code = ("import sys\nsys.modules['openvino'] = None\nimport importlib, pkgutil, rlopt.backends.openvino as p\n"
            "names = [m.name for m in pkgutil.walk_packages(p.__path__, p.__name__ + '.')]\n"
            "[importlib.import_module(n) for n in names]\nprint(len(names))")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0 and int(proc.stdout) >= 7, proc.stderr[-2000:]


def test_the_reason_names_the_extra_to_install(no_openvino: None) -> None:
    assert unavailable_reason("openvino") == REASON
    with pytest.raises(BackendUnavailable, match=r"pip install 'rlopt\[openvino\]'"):
        library.import_openvino()
    with pytest.raises(BackendUnavailable, match=r"pip install 'rlopt\[openvino\]'"):
        library.shared_core()


def test_a_recipe_naming_openvino_compiles_the_others_and_records_why_it_skipped(no_openvino: None,
                                                                                  tmp_path: Path) -> None:
    from rlopt.compile import compile_recipe

    result = compile_recipe(write_tiny_recipe(tmp_path, backends="[torchscript, openvino]"), tmp_path / "out")
    assert result.passed, result.failures
    for name, network in result.manifest.networks.items():
        assert network.artifacts["openvino"].skipped == REASON, name
        assert network.artifacts["torchscript"].verified and network.selected == "torchscript"
        stage = next(s for s in network.stages if s["stage"] == "openvino")
        assert stage["status"] == "skipped" and "cache" not in stage, "a cached IR could not be verified here"
        assert not (result.model_dir / name / "model.xml").exists()
        assert not any("openvino" in path for path in network.files)
