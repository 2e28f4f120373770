"""TorchScript: the scripted module itself, served by libtorch (and Triton's pytorch_libtorch)."""

from __future__ import annotations

import os
from typing import Any

from rlopt.backends.base import Backend, module_missing
from rlopt.backends.torchscript.facts import TorchScriptFacts


def _threads(facts: TorchScriptFacts) -> int | str:
    return int(os.environ.get("OMP_NUM_THREADS", "0")) or "torch default"


def _one_thread(facts: dict[str, Any]) -> dict[str, Any]:
    """PyTorch's intra-op threads are process-wide: every parity gate holds them at one (rlopt.reference.one_torch_thread)."""
    return dict(facts)


BACKEND = Backend(
    name="torchscript", module="torch",
    runner="rlopt.backends.torchscript.runner:TorchScriptRunner",
    unavailable=lambda facts: module_missing("torch"), threads=_threads, facts=TorchScriptFacts,
    distributions=(("torch", ("torch",)),),
    triton_platform=("pytorch_libtorch", "model.pt"),
    stages=("rlopt.backends.torchscript.stages:TorchScriptArtifact",),
    refit="rlopt.backends.torchscript.refit:refit_artifact", one_thread=_one_thread)
