"""ONNX Runtime's CUDA provider without TF32 surprises: `use_tf32` is on by default in ONNX Runtime, so rlopt opens
the provider with `onnxruntime.tf32` (false by default), records it, and reopens every session the same way.

This machine has no CUDA provider: an `onnxruntime` stand-in that has one records the providers each session is
opened with (ONNX Runtime takes a (name, options) pair where options are given)."""

from __future__ import annotations

import types
from pathlib import Path
from typing import Any

import pytest

from rlopt.backends.onnxruntime.build import NO_TF32_SWITCH, check_onnxruntime, gpu_facts
from rlopt.backends.onnxruntime.facts import OnnxRuntimeFacts
from rlopt.onnx_session import make_session
from rlopt.backends.onnxruntime.config import OnnxRuntimeConfig

CUDA, CPU, TRT = "CUDAExecutionProvider", "CPUExecutionProvider", "TensorrtExecutionProvider"


def ort_with_cuda(opened: list[Any]) -> types.ModuleType:
    ort = types.ModuleType("onnxruntime")
    ort.__version__ = "1.32.0"

    class SessionOptions:
        def add_session_config_entry(self, key: str, value: str) -> None:
            pass

    class InferenceSession:
        def __init__(self, model: Any, sess_options: Any = None, providers: list[Any] | None = None) -> None:
            opened.append(list(providers or []))
            self._providers = [p if isinstance(p, str) else p[0] for p in providers or []]

        def get_providers(self) -> list[str]:
            return self._providers

    ort.SessionOptions, ort.InferenceSession = SessionOptions, InferenceSession
    ort.GraphOptimizationLevel = types.SimpleNamespace(ORT_ENABLE_ALL=99)
    ort.get_available_providers = lambda: [TRT, CUDA, CPU]
    return ort


@pytest.fixture()
def opened(monkeypatch: pytest.MonkeyPatch) -> list[Any]:
    sessions: list[Any] = []
    ort = ort_with_cuda(sessions)
    monkeypatch.setattr("rlopt.backends.onnxruntime.build.require", lambda name: ort)
    monkeypatch.setattr("rlopt.onnx_session.require", lambda name: ort)
    return sessions


@pytest.mark.parametrize("tf32", [False, True])
def test_the_cuda_provider_is_opened_with_use_tf32_as_the_recipe_says(tmp_path: Path, opened: list[Any],
                                                                     tf32: bool) -> None:
    out = check_onnxruntime(tmp_path / "model.onnx", OnnxRuntimeConfig(providers=[CUDA, CPU], tf32=tf32))
    assert opened == [[(CUDA, {"use_tf32": "1" if tf32 else "0"}), CPU]]
    assert out.facts.tf32 is tf32
    assert out.facts.precision_built == ("tf32" if tf32 else None)
    facts = OnnxRuntimeFacts.of(out.facts)
    make_session(tmp_path / "model.onnx", providers=facts.session_providers, provider_options=facts.provider_options)
    assert opened[-1] == opened[0], "the runner reopens the provider as the build proved it"


def test_a_cpu_session_gets_no_provider_options_and_no_gpu_facts(tmp_path: Path, opened: list[Any]) -> None:
    out = check_onnxruntime(tmp_path / "model.onnx", OnnxRuntimeConfig())
    assert opened == [[CPU]] and "tf32" not in out.facts and "gpu" not in out.facts
    assert OnnxRuntimeFacts.of(out.facts).provider_options == {}


def test_the_tensorrt_provider_has_no_tf32_switch_and_is_gated_as_tf32() -> None:
    facts = gpu_facts(OnnxRuntimeConfig(providers=[TRT, CUDA, CPU]))
    assert facts["precision_built"] == "tf32" and facts["notice"] == NO_TF32_SWITCH and facts["tf32"] is False


def test_an_artifact_from_before_tf32_was_recorded_keeps_onnx_runtime_defaults() -> None:
    assert OnnxRuntimeFacts.of({"providers": [CUDA, CPU]}).provider_options == {}
