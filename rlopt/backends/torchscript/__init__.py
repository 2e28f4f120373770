"""TorchScript: the scripted module itself, served by libtorch (and Triton's pytorch_libtorch); on the CPU, or on CUDA
with one CUDA graph per named shape (recipe `torchscript: {device: cuda}`, the `cuda` subpackage)."""

from __future__ import annotations

import os
from typing import Any

from rlopt.backends.base import Backend, module_missing
from rlopt.backends.torchscript.facts import TorchScriptFacts


def _unavailable(facts: TorchScriptFacts) -> str | None:
    missing = module_missing("torch")
    if missing or not facts.on_cuda:
        return missing
    from rlopt.backends.torchscript.cuda import gate

    return gate.unavailable_reason()


def _threads(facts: TorchScriptFacts) -> int | str:
    if facts.on_cuda:
        return "GPU"
    return int(os.environ.get("OMP_NUM_THREADS", "0")) or "torch default"


def _one_thread(facts: dict[str, Any]) -> dict[str, Any]:
    """PyTorch's intra-op threads are process-wide: every parity gate holds them at one (rlopt.reference.one_torch_thread)."""
    return dict(facts)


BACKEND = Backend(
    name="torchscript", module="torch",
    runner="rlopt.backends.torchscript.runner:open_torchscript",
    unavailable=_unavailable, threads=_threads, facts=TorchScriptFacts,
    triton_platform=("pytorch_libtorch", "model.pt"),
    stages=("rlopt.backends.torchscript.stages:TorchScriptArtifact",),
    refit="rlopt.backends.torchscript.refit:refit_artifact", one_thread=_one_thread)
