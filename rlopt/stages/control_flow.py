"""Which `if`/`for` of a scripted network depend on its inputs: the branches a trace would freeze.

The trace export fallback (rlopt.stages.export_onnx) is not tried for a network whose own code branches or
loops on input values or shapes. Library internals (torch's own modules), conditions on constants, non-tensor
attributes and torch's mode, and input checks that only raise are not listed.
"""

from __future__ import annotations

import os
import re
from typing import Any

# conditions on these do not depend on the inputs (they read how torch is running)
_ENVIRONMENT_OPS = {"aten::is_grad_enabled", "aten::is_autocast_enabled", "aten::is_autocast_cpu_enabled",
                    "prim::is_nested", "prim::is_cuda", "prim::is_mkldnn", "prim::device", "prim::dtype",
                    "prim::requires_grad", "aten::is_scripting", "prim::is_sparse", "prim::is_quantized",
                    "prim::is_meta", "prim::is_xpu", "prim::layout"}


def _torch_library_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _source_file(node: Any) -> str:
    """'file:line' of a node's Python source, or '' (nodes the scripter made itself, e.g. for `a and b`)."""
    try:
        text = node.sourceRange()
    except Exception:  # a node without debug info
        return ""
    match = re.search(r'File "([^"]+)", line (\d+)', text or "")
    return f"{match.group(1)}:{match.group(2)}" if match else ""


def _node_source(node: Any) -> str:
    """The node's source, else its condition's, else the enclosing node's."""
    where = _source_file(node)
    if not where:
        inputs = list(node.inputs())
        where = _source_file(inputs[0].node()) if inputs else ""
    owner = node.owningBlock().owningNode() if not where else None
    while not where and owner is not None:
        where = _source_file(owner)
        owner = owner.owningBlock().owningNode()
    return where


def _is_library(where: str, library: str) -> bool:
    """torch's own code, as a file (fresh script) or as its serialized qualified name (a loaded model.ts)."""
    return where.startswith(library) or where.startswith("code/__torch__/torch/")


def _fixed_value(value: Any, seen: dict[Any, bool]) -> bool:
    """True when `value` derives only from constants, non-tensor attributes and how torch runs: a trace that
    freezes it freezes what every call would compute anyway."""
    if value in seen:
        return seen[value]
    seen[value] = False  # cycles (loop-carried values) are not fixed
    node = value.node()
    kind = node.kind()
    if kind == "prim::Param":
        fixed = False  # a graph input: the observation, or a loop's carried value
    elif kind == "prim::Constant" or kind in _ENVIRONMENT_OPS:
        fixed = True
    elif kind == "prim::GetAttr":
        fixed = not value.type().isSubtypeOf(_tensor_type())  # a weight may change on refit
    elif list(node.blocks()):
        fixed = False
    else:
        fixed = all(_fixed_value(v, seen) for v in node.inputs())
    seen[value] = fixed
    return fixed


def _tensor_type() -> Any:
    import torch

    return torch._C.TensorType.get()


def _asserts_only(node: Any) -> bool:
    """An If with a branch that only raises: an input check, which a trace drops without changing results."""
    for block in node.blocks():
        if any(inner.kind() == "prim::RaiseException" for inner in block.nodes()):
            return True
    return False


def control_flow_blockers(scripted: Any) -> list[str]:
    """The network's own `if`/`for` whose condition depends on input values or shapes ('kind at file:line').

    Tracing freezes such a branch at the example's values, so the trace fallback is refused for them.
    Library internals (torch's own modules) and branches on constants / attributes / torch's mode are not listed.
    """
    library = _torch_library_dir()
    graph = scripted.inlined_graph
    seen: dict[Any, bool] = {}
    found: list[str] = []

    def visit(block: Any) -> None:
        for node in block.nodes():
            kind = node.kind()
            if kind in ("prim::If", "prim::Loop"):
                where = _node_source(node)
                internal = _is_library(where, library)
                inputs = list(node.inputs())
                conditions = inputs[:1] if kind == "prim::If" else inputs[:2]
                fixed = all(_fixed_value(v, seen) for v in conditions)
                if not internal and not fixed and not (kind == "prim::If" and _asserts_only(node)):
                    label = "if" if kind == "prim::If" else "loop"
                    found.append(f"{label} at {_short(where)}")
            for inner in node.blocks():
                visit(inner)

    visit(graph)
    return list(dict.fromkeys(found))


def _short(where: str) -> str:
    if not where:
        return "(unknown source)"
    file, _, line = where.rpartition(":")
    return f"{os.path.basename(file)}:{line}"
