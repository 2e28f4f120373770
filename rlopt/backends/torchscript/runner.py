"""Runner for `model.ts`: the scripted module, run under inference mode on the CPU (on CUDA: rlopt.backends.torchscript.cuda)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends.base import Runner
from rlopt.backends.torchscript.facts import TorchScriptFacts
from rlopt.errors import ArtifactError, located
from rlopt.lazy import require
from rlopt.backends.base import flatten_outputs


class TorchScriptRunner(Runner):
    def __init__(self, path: Path, input_names: list[str], facts: TorchScriptFacts | Mapping[str, Any]) -> None:
        torch = require("torch")
        self._torch = torch
        self.input_names = input_names
        try:
            self._module = torch.jit.load(str(path), map_location="cpu").eval()
        except RuntimeError as exc:
            raise ArtifactError(located(path, "", f"not a loadable TorchScript file ({str(exc).splitlines()[0]})",
                                        "recompile MODEL_DIR")) from None

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self._torch
        with torch.inference_mode():
            result = self._module(*[torch.from_numpy(feeds[name]) for name in self.input_names])
        return [t.detach().numpy() for t in flatten_outputs(result)]

    def close(self) -> None:
        self._module = None


def open_torchscript(path: Path, input_names: list[str], facts: TorchScriptFacts | Mapping[str, Any]) -> Runner:
    """The runner the artifact was built for: on the CPU, or on CUDA with its graphs (facts.device)."""
    typed = TorchScriptFacts.of(facts)
    if typed.on_cuda:
        from rlopt.backends.torchscript.cuda.runner import CudaTorchScriptRunner

        return CudaTorchScriptRunner(path, input_names, typed)
    return TorchScriptRunner(path, input_names, typed)
