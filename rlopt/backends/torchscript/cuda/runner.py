"""Runner for `model.ts` on CUDA: a captured CUDA graph for each named shape, the scripted module eagerly for the rest.

The graphs are captured when the runner opens (one per named shape the build recorded, `facts.graph_shapes`); a
shape whose capture fails (a host synchronisation inside the model, say) runs eagerly and `events()` says why.
Eager calls are thread-safe as TorchScript's are; graph replays take their graph's lock (graphs.ShapeGraph). The
eager path is a parity variant: compile's gate checks both, so an unnamed shape is as verified as a named one.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends.base import Infer, Runner
from rlopt.backends.torchscript.cuda import gate
from rlopt.backends.torchscript.cuda.graphs import ShapeGraph, cast_inputs, fp32_outputs
from rlopt.backends.torchscript.facts import TorchScriptFacts
from rlopt.errors import ArtifactError, BackendUnavailable, located

COMPUTE = {"fp16": "float16", "bf16": "bfloat16"}


def innermost(exc: BaseException) -> str:
    """The error under TorchScript's wrapping ('The following operation failed in the TorchScript interpreter. ...
    RuntimeError: <the error>'): its last line that says something, else its first line."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    telling = [line for line in lines if not line.endswith(":")]
    return telling[-1] if telling and telling[-1] != lines[0] and ":" in telling[-1] else \
        (lines[0] if lines else type(exc).__name__)


class CudaTorchScriptRunner(Runner):
    def __init__(self, path: Path, input_names: list[str], facts: TorchScriptFacts | Mapping[str, Any], *,
                 torch: Any = None) -> None:
        facts = TorchScriptFacts.of(facts)
        if torch is None:
            reason = gate.unavailable_reason()
            if reason is not None:
                raise BackendUnavailable(reason)
            torch = gate.cuda_torch()
        self._torch, self.input_names, self._device = torch, input_names, gate.device()
        precision = facts.precision_built or "fp32"
        if precision == "fp32":
            gate.exact_fp32(torch)
        self._compute = getattr(torch, COMPUTE[precision]) if precision in COMPUTE else None
        try:
            module = torch.jit.load(str(path), map_location=self._device).eval()
        except RuntimeError as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            if "CUDA" in str(exc):  # the GPU, not the file: a skip with the reason
                raise BackendUnavailable(f"TorchScript on CUDA could not start ({first})") from None
            raise ArtifactError(located(path, "", f"not a loadable TorchScript file ({first})",
                                        "recompile MODEL_DIR")) from None
        self._module = module.to(self._compute) if self._compute is not None else module
        dtypes = {name: np.dtype(facts.input_dtypes.get(name, "float32")) for name in input_names}
        self._dtypes = [dtypes[name] for name in input_names]
        self.graphs: dict[tuple[tuple[int, ...], ...], ShapeGraph] = {}
        self._events: list[dict[str, Any]] = []
        if facts.cuda_graphs:
            for label, shapes in facts.graph_shapes.items():
                signature = tuple(tuple(shapes[name]) for name in input_names)
                try:
                    self.graphs[signature] = ShapeGraph(torch, self._module, list(zip(signature, self._dtypes)),
                                                        self._compute, self._device)
                except RuntimeError as exc:  # CUDA refused the capture: this shape runs eagerly
                    self._events.append({"event": "cuda graph not captured", "shape": label,
                                         "reason": innermost(exc)})

    def eager(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        torch = self._torch
        with torch.inference_mode():
            tensors = [torch.from_numpy(np.ascontiguousarray(feeds[name], dtype=dtype)).to(self._device)
                       for name, dtype in zip(self.input_names, self._dtypes)]
            result = self._module(*cast_inputs(torch, tensors, self._compute))
            return [t.cpu().numpy() for t in fp32_outputs(torch, result, self._compute)]

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        graph = self.graphs.get(tuple(feeds[name].shape for name in self.input_names)) if self.graphs else None
        if graph is None:
            return self.eager(feeds)
        return graph.replay([np.asarray(feeds[name], dtype=dtype) for name, dtype in zip(self.input_names,
                                                                                          self._dtypes)])

    def parity_variants(self) -> dict[str, Infer]:
        """The eager path serves every shape without a graph: the gate checks it as well as the graphs."""
        return {"eager": self.eager} if self.graphs else {}

    def events(self) -> list[dict[str, Any]]:
        return list(self._events)

    def close(self) -> None:
        self.graphs = {}
        self._module = None
