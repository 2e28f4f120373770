"""TorchScript: the scripted module itself, served by libtorch (and Triton's pytorch_libtorch); on the CPU, or on CUDA
with one CUDA graph per named shape (recipe `torchscript: {device: cuda}`, the `cuda` subpackage)."""

from __future__ import annotations

import os
import sys

from rlopt.backends.base import module_missing
from rlopt.backends.capability import Backend, TritonModel
from rlopt.backends.torchscript.config import TorchScriptConfig
from rlopt.backends.torchscript.facts import TorchScriptFacts


def _unavailable(facts: TorchScriptFacts) -> str | None:
    missing = module_missing("torch")
    if missing or not facts.on_cuda:
        return missing
    from rlopt.backends.torchscript.cuda import gate

    return gate.unavailable_reason()


def _threads(facts: TorchScriptFacts) -> int | str:
    """torch's intra-op threads where torch is loaded (they are process-wide), else what OMP_NUM_THREADS will set;
    on CUDA, the GPU."""
    if facts.on_cuda:
        return "GPU"
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "get_num_threads"):
        return int(torch.get_num_threads())
    return int(os.environ.get("OMP_NUM_THREADS", "0")) or "torch default"


def _one_thread(facts: TorchScriptFacts) -> TorchScriptFacts:
    """PyTorch's intra-op threads are process-wide: every parity gate holds them at one (rlopt.reference.one_torch_thread)."""
    return facts


BACKEND = Backend(
    name="torchscript", module="torch",
    runner="rlopt.backends.torchscript.runner:open_torchscript",
    stages=("rlopt.backends.torchscript.stages:TorchScriptArtifact",),
    unavailable=_unavailable, threads=_threads, facts=TorchScriptFacts, config=TorchScriptConfig,
    distributions=(("torch", ("torch",)),),
    triton=TritonModel(platform="pytorch_libtorch", filename="model.pt",
                       note="Triton's PyTorch backend matches tensors by position: <name>__<index>.",
                       rules="rlopt.backends.torchscript.triton:positional_names"),
    refit="rlopt.backends.torchscript.refit:refit_artifact", one_thread=_one_thread)
