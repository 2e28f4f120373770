"""Stage 1: torch.jit.script the network's submodule, keeping data-dependent branches."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path
from typing import Any

from rlopt.errors import StageError, located
from rlopt.lazy import require
from rlopt.stages.base import StageOutput

_LOCATION = re.compile(r'File "([^"]+)", line (\d+)')
_MANGLE = re.compile(r"___torch_mangle_\d+")


def describe_script_error(exc: BaseException) -> str:
    """TorchScript errors span many lines; keep the construct and where it is."""
    lines = [line.strip() for line in str(exc).strip().splitlines() if line.strip()]
    construct = lines[0] if lines else type(exc).__name__
    where = _LOCATION.findall(str(exc))
    if where:
        file, line = where[-1]
        construct += f" (at {Path(file).name}:{line})"
    return construct.rstrip(":")


def script_network(module: Any, out_path: Path, *, recipe_path: Path, network: str, module_path: str) -> StageOutput:
    torch = require("torch")
    try:
        scripted = torch.jit.script(module)
        scripted.save(str(out_path))
    except Exception as exc:  # torch.jit raises NotSupportedError, RuntimeError, OSError, TypeError ...
        raise StageError(located(recipe_path, f"networks.{network}.module",
                                 f"'{module_path or '(whole model)'}' cannot be scripted: {describe_script_error(exc)}",
                                 "make forward TorchScript-compatible (type-annotate, avoid unsupported Python)")) from None
    graph_text = str(scripted.graph)
    return StageOutput(out_path, {"branches": graph_text.count("prim::If"), "torch": torch.__version__,
                                  "fingerprint": module_fingerprint(scripted)})


def module_fingerprint(scripted: Any) -> str:
    """sha256 of every submodule's TorchScript code and every parameter/buffer: the model's identity.

    model.ts itself is not byte-stable between runs (mangled names), so caches key on this instead.
    """
    digest = hashlib.sha256()
    for name, module in scripted.named_modules():
        digest.update(name.encode())
        digest.update(_MANGLE.sub("", module.code).encode())
    for name, tensor in sorted(scripted.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()
