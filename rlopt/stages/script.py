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
    graph_digest, weights_digest = graph_sha256(scripted), weights_sha256(scripted)
    fingerprint = hashlib.sha256(f"{graph_digest}:{weights_digest}".encode()).hexdigest()
    return StageOutput(out_path, {"branches": graph_text.count("prim::If"), "torch": torch.__version__,
                                  "fingerprint": fingerprint, "graph_sha256": graph_digest,
                                  "weights_sha256": weights_digest})


_COMMENT = re.compile(r"\s+#\s.*$", re.MULTILINE)
# load_model imports a recipe's model file as `rlopt_user_<stem>_<hash of its path>`, and Python's str hash
# differs per process: the suffix would make the graph digest (and every cache key) differ per process
_USER_MODULE = re.compile(r"\b(rlopt_user_\w*?)_\d+\b")


def _plain(value: Any) -> bool:
    """A value that belongs in the graph digest: numbers, flags, strings, None and lists/tuples of them."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return True
    return isinstance(value, (list, tuple)) and all(_plain(item) for item in value)


def _attribute_values(scripted: Any, graph: Any) -> list[str]:
    """`path=value` of every non-tensor, non-module attribute the graph reads (floats, flags, `training`).

    Constants declared in `__constants__` are already in the graph text; plain attributes are read with
    prim::GetAttr and their values would otherwise be invisible to the digest.
    """
    values: dict[Any, tuple[str, Any]] = {}
    inputs = list(graph.inputs())
    if inputs:
        values[inputs[0]] = ("self", scripted)
    found: list[str] = []

    def visit(block: Any) -> None:
        for node in block.nodes():
            if node.kind() == "prim::GetAttr" and node.input() in values:
                path, parent = values[node.input()]
                name = node.s("name")
                try:
                    child = getattr(parent, name)
                except Exception:  # an attribute TorchScript knows but Python cannot reach: the type is in the graph
                    child = None
                values[node.output()] = (f"{path}.{name}", child)
                if _plain(child):
                    found.append(f"{path}.{name}={child!r}")
            for inner in node.blocks():
                visit(inner)

    visit(graph)
    return sorted(set(found))


def graph_sha256(scripted: Any) -> str:
    """sha256 of the inlined TorchScript graph (without source comments and mangled names) and the non-tensor
    attributes it reads: the architecture, apart from the weights. A refit keeps this and changes only the weights."""
    graph = scripted.inlined_graph
    text = _USER_MODULE.sub(r"\1", _MANGLE.sub("", _COMMENT.sub("", str(graph))))
    digest = hashlib.sha256(text.encode())
    for entry in _attribute_values(scripted, graph):
        digest.update(entry.encode())
    return digest.hexdigest()


def weights_sha256(scripted: Any) -> str:
    """sha256 of every parameter and buffer (name, dtype, shape, bytes)."""
    digest = hashlib.sha256()
    for name, tensor in sorted(scripted.state_dict().items()):
        digest.update(f"{name}:{tensor.dtype}:{tuple(tensor.shape)}".encode())
        digest.update(tensor.detach().contiguous().cpu().numpy().tobytes())
    return digest.hexdigest()


def module_fingerprint(scripted: Any) -> str:
    """The model's identity: sha256 over the graph digest and the weights digest.

    Works for every scripted module (containers, RNNs, builtin modules without `.code`). model.ts itself is not
    byte-stable between runs (mangled names), so caches key on this instead.
    """
    return hashlib.sha256(f"{graph_sha256(scripted)}:{weights_sha256(scripted)}".encode()).hexdigest()
