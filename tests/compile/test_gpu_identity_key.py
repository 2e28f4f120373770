"""The GPU's identity in the stage cache: a plan or a verdict from another GPU, driver or TensorRT is never reused;
the verdict's key holds the runner's own code; TensorRT's version is found whichever distribution provides it."""

from __future__ import annotations

import sys
import types
from pathlib import Path
from typing import Any

import pytest

from rlopt.compile.cache import StageCache
from rlopt.compile.engine import Engine, key_components
from rlopt.stages.base import Context, Stage, StageOutput, package_digest
from rlopt.recipe import load_recipe
from tests.conftest import write_tiny_recipe

A10G = {"name": "NVIDIA A10G", "compute_capability": "8.6", "driver": "550.54.15", "cuda_runtime": "12.8",
        "tensorrt": "10.13.3.9"}


class Plan(Stage):
    """A cached, machine-dependent stage, as TensorRT's engine build and every `verify <backend>` are."""

    name, outputs, cached, machine_dependent = "plan", ("model.plan",), True, True
    runs = 0

    def run(self, ctx: Context) -> StageOutput:
        type(self).runs += 1
        path = ctx.dir / "model.plan"
        path.write_bytes(b"engine")
        return StageOutput(path, {})


@pytest.fixture()
def ctx(tmp_path: Path) -> Context:
    recipe_path = write_tiny_recipe(tmp_path, backends="[torchscript]")
    recipe = load_recipe(recipe_path)
    context = Context(recipe, recipe_path, "policy", recipe.networks["policy"], tmp_path / "staging")
    context.dir.mkdir(parents=True)
    return context


def _on_gpu(monkeypatch: pytest.MonkeyPatch, identity: dict[str, Any] | None) -> None:
    monkeypatch.setattr("rlopt.compile.engine.gpu_identity", lambda: identity)


def test_a_cached_plan_is_reused_only_on_the_same_gpu(ctx: Context, tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    engine = Engine(Silent(), StageCache(tmp_path / "cache"))
    Plan.runs = 0
    _on_gpu(monkeypatch, A10G)
    engine.run(Plan(), ctx)
    engine.run(Plan(), ctx)
    assert Plan.runs == 1 and ctx.stages[-1]["cache"] == "hit"
    for field, other in [("driver", "560.28.03"), ("name", "NVIDIA L4"), ("tensorrt", "11.4.0.106")]:
        _on_gpu(monkeypatch, {**A10G, field: other})
        engine.run(Plan(), ctx)
        assert ctx.stages[-1]["cache"].startswith("miss") and f"gpu.{field} changed" in ctx.stages[-1]["cache"]
    assert Plan.runs == 4


def test_a_cpu_only_machine_keeps_its_keys(ctx: Context, monkeypatch: pytest.MonkeyPatch) -> None:
    _on_gpu(monkeypatch, None)
    assert "gpu" not in key_components(Plan(), ctx) and "machine" in key_components(Plan(), ctx)
    _on_gpu(monkeypatch, A10G)
    assert key_components(Plan(), ctx)["gpu"] == A10G


def test_the_verdict_key_holds_the_runner_package_code(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`verify <backend>` keys on every source file of the runner's package: a runner fix re-runs the gate."""
    package = tmp_path / "fakebackend"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "runner.py").write_text("class R: pass\n")
    (package / "helper.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    before = package_digest("fakebackend.runner")
    (package / "helper.py").write_text("X = 2\n")
    assert package_digest("fakebackend.runner") != before
    assert package_digest("rlopt.backends.tensorrt.runner") == package_digest("rlopt.backends.tensorrt.build")


def test_verify_stage_config_names_the_runner_code(ctx: Context) -> None:
    from rlopt.backends.torchscript.facts import TorchScriptFacts
    from rlopt.compile.measure import VerifyBackend
    from rlopt.parity import Tolerance

    ctx.artifacts["reference.npz"] = ctx.dir / "reference.npz"
    ctx.artifacts["reference.npz"].write_bytes(b"npz")
    ctx.keys["module"] = "graph-and-weights"
    stage = VerifyBackend("torchscript", StageOutput(ctx.dir / "model.ts", TorchScriptFacts()), Tolerance(1e-4, 1e-3, 1e-4),
                          identity=ctx.keys["module"])
    assert stage.config(ctx)["runner_code"] == package_digest("rlopt.backends.torchscript.runner")


def test_tensorrt_version_comes_from_whichever_distribution_provides_it(monkeypatch: pytest.MonkeyPatch) -> None:
    """tensorrt-cu12 installs the module `tensorrt`; no distribution is named `tensorrt` then."""
    import importlib.metadata
    import importlib.util

    from rlopt.lazy import module_version

    versions = {"tensorrt-cu12": "10.13.3.9"}
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: object() if name == "tensorrt" else None)
    monkeypatch.setattr("rlopt.lazy.version_of", lambda name: versions.get(name))
    monkeypatch.setattr(importlib.metadata, "packages_distributions", lambda: {"tensorrt": ["tensorrt-cu12"]})
    assert module_version("tensorrt") == "10.13.3.9"
    monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
    assert module_version("tensorrt") is None


class Silent:
    def stage_started(self, network: str, stage: str) -> None:
        pass

    def stage_finished(self, network: str, stage: str, status: str, seconds: float, detail: str) -> None:
        pass


def test_gpu_identity_reads_nvidia_smi_and_the_builds(monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt import machine

    monkeypatch.setattr(machine, "gpu_absent_reason", lambda: None)
    monkeypatch.setattr(machine, "_nvidia_smi_query", lambda: ["NVIDIA A10G", "8.6", "550.54.15"])
    monkeypatch.setattr(machine, "torch_cuda_build", lambda: "12.8")
    monkeypatch.setattr("rlopt.lazy.module_version", lambda name: "10.13.3.9" if name == "tensorrt" else None)
    machine.gpu_identity.cache_clear()
    try:
        assert machine.gpu_identity() == A10G
    finally:
        machine.gpu_identity.cache_clear()
    monkeypatch.setattr(machine, "gpu_absent_reason", lambda: "no NVIDIA GPU (test)")
    try:
        assert machine.gpu_identity() is None
    finally:
        machine.gpu_identity.cache_clear()


def test_torch_cuda_build_is_read_without_importing_torch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from rlopt import machine

    fake = tmp_path / "torch"
    fake.mkdir()
    (fake / "__init__.py").write_text("raise ImportError('never imported')\n")
    (fake / "version.py").write_text("from typing import Optional\ncuda: Optional[str] = '12.8'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "torch", raising=False)
    assert machine.torch_cuda_build() == "12.8"
    (fake / "version.py").write_text("cuda = None\n")
    assert machine.torch_cuda_build() is None
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(version=types.SimpleNamespace(cuda="13.0")))
    assert machine.torch_cuda_build() == "13.0"
