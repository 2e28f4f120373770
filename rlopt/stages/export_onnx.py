"""Stage 2: ONNX from the scripted module, so that `if x.size(0) > 1` survives as an If node.

The dynamo exporter specializes such branches silently (see shared notes); the TorchScript-based
exporter keeps them. Dynamic dims are named; one self-contained file; checked by onnx.checker.

Export chain, first that works wins (facts: `export_path`, and `refused` for what the earlier path refused):
1. `script`: the scripted module (keeps data-dependent branches).
2. `trace`: the eager module traced by the same exporter, where the scripted graph has an op the TorchScript
   exporter refuses (a scripted GRUCell's prim::ListConstruct, TransformerEncoder's aten::is_autocast_enabled).
   Refused when the network's own code branches or loops on values or shapes (a trace freezes that branch);
   library internals (nn.LSTM's `batch_first` checks) and conditions on constants and attributes are fine.
3. `dynamo`: torch.onnx.export(dynamo=True), only when `onnxscript` imports.
The compile's parity gate then checks every backend at min, opt and max (batch 1 and > 1).
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import warnings
from pathlib import Path
from typing import Any

from rlopt.errors import StageError, first_line, located
from rlopt.lazy import require
from rlopt.onnx_graph import index_ranges
from rlopt.spec import InputSpec, NetworkSpec
from rlopt.stages.base import StageOutput

EXPORTER = "torch.onnx.export (TorchScript-based, dynamo=False) from the scripted module"
EXPORTERS = {
    "script": EXPORTER,
    "trace": "torch.onnx.export (TorchScript-based, dynamo=False) tracing the eager module",
    "dynamo": "torch.onnx.export (dynamo=True) from the eager module",
}
_OP = re.compile(r"\b(?:aten|prim|onnx|quantized|_caffe2)::\w+")
_NAMED_OP = re.compile(r"operator '?([\w:.]+)'?|'(\w+::\w+)'")
# conditions on these do not depend on the inputs (they read how torch is running)
_ENVIRONMENT_OPS = {"aten::is_grad_enabled", "aten::is_autocast_enabled", "aten::is_autocast_cpu_enabled",
                    "prim::is_nested", "prim::is_cuda", "prim::is_mkldnn", "prim::device", "prim::dtype",
                    "prim::requires_grad", "aten::is_scripting", "prim::is_sparse", "prim::is_quantized",
                    "prim::is_meta", "prim::is_xpu", "prim::layout"}


def dynamic_dim_names(inputs: dict[str, InputSpec]) -> dict[str, dict[int, str]]:
    """'batch' for a dynamic dim 0 shared by all inputs with the same range, '<input>_d<axis>' otherwise."""
    batch_ranges = {(spec.dims("min")[0], spec.dims("max")[0]) for spec in inputs.values() if 0 in spec.dynamic_axes}
    shared_batch = len(batch_ranges) == 1
    names: dict[str, dict[int, str]] = {}
    for name, spec in inputs.items():
        axes = {}
        for axis in spec.dynamic_axes:
            axes[axis] = "batch" if axis == 0 and shared_batch else f"{name}_d{axis}"
        names[name] = axes
    return names


def example_inputs(inputs: dict[str, InputSpec], point: str = "opt") -> tuple:
    torch = require("torch")
    tensors = []
    for spec in inputs.values():
        dtype = getattr(torch, spec.dtype)
        shape = spec.dims(point)
        tensors.append(torch.zeros(shape, dtype=dtype) if dtype in (torch.bool, torch.uint8) else
                       torch.ones(shape, dtype=dtype))
    return tuple(tensors)


def refused_op(exc: BaseException) -> str:
    """'<op>: <first line of the message>' for an exporter error (the op named in it, else the error type)."""
    text = str(exc)
    first = first_line(exc)
    named = _NAMED_OP.search(first)
    op = next((g for g in named.groups() if g), "") if named else ""
    if "::" not in op:
        found = _OP.search(first) or _OP.search(text)
        op = found.group(0) if found else (op or type(exc).__name__)
    if len(first) > 200:
        first = first[:197] + "..."
    return f"{op}: {first}"


@contextlib.contextmanager
def quiet_file_descriptors() -> Any:
    """Silence fds 1 and 2 as well as sys.stdout/err: the exporter prints graphs from C++ on failure, and
    `--json` promises one document on stdout."""
    import sys
    import tempfile

    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    saved: list[int] = []
    with tempfile.TemporaryFile() as sink:
        try:
            for fd in (1, 2):
                saved.append(os.dup(fd))
                os.dup2(sink.fileno(), fd)
        except OSError:  # no real descriptors (embedded interpreters): Python-level silence only
            pass
        try:
            with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
                yield
        finally:
            for fd, copy in zip((1, 2), saved):
                os.dup2(copy, fd)
                os.close(copy)


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


def _dynamo_unavailable() -> str | None:
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        return "the dynamo exporter needs onnxscript, which is not installed (pip install onnxscript)"
    return None


def _export(torch: Any, module: Any, spec: NetworkSpec, opset: int, out_path: Path,
            dynamic_axes: dict[str, dict[int, str]], *, dynamo: bool = False) -> None:
    with warnings.catch_warnings(), quiet_file_descriptors():
        warnings.simplefilter("ignore")
        if dynamo:
            from torch.export import Dim

            # positional (a tuple in forward's argument order): the recipe's input names need not be forward's
            shapes = tuple({axis: Dim.AUTO for axis in dynamic_axes.get(name, {})} or None for name in spec.inputs)
            torch.onnx.export(module, example_inputs(spec.inputs), str(out_path), dynamo=True,
                              input_names=list(spec.inputs), output_names=list(spec.outputs),
                              dynamic_shapes=shapes,
                              opset_version=opset, external_data=False)
        else:
            torch.onnx.export(module, example_inputs(spec.inputs), str(out_path), dynamo=False,
                              input_names=list(spec.inputs), output_names=list(spec.outputs),
                              dynamic_axes=dynamic_axes, opset_version=opset, do_constant_folding=True)


def export_onnx(ts_path: Path, spec: NetworkSpec, opset: int, out_path: Path, *, recipe_path: Path,
                network: str, eager_module: Any = None) -> StageOutput:
    """ONNX from the scripted module; where the exporter refuses one of its ops, from the eager module (see the
    module docstring). `eager_module` is the network's nn.Module (needed for the fallbacks)."""
    torch = require("torch")
    onnx = require("onnx")
    scripted = torch.jit.load(str(ts_path), map_location="cpu")
    dynamic_axes = {name: axes for name, axes in dynamic_dim_names(spec.inputs).items() if axes}
    facts: dict[str, Any] = {}
    try:
        _export(torch, scripted, spec, opset, out_path, dynamic_axes)
        facts["export_path"] = "script"
    except Exception as exc:  # the exporter raises many types for unsupported operators
        facts["refused"] = refused_op(exc)
        facts["export_path"] = _fallback(torch, scripted, eager_module, spec, opset, out_path, dynamic_axes,
                                         facts, recipe_path=recipe_path, network=network)
    model = onnx.load(str(out_path))
    graph_outputs = [o.name for o in model.graph.output]
    if graph_outputs != list(spec.outputs):
        out_path.unlink()
        raise StageError(located(recipe_path, f"networks.{network}.outputs",
                                 f"the module returns {len(graph_outputs)} outputs, the recipe names {len(spec.outputs)}",
                                 "list one name per returned tensor"))
    onnx.checker.check_model(model, full_check=True)
    op_types = sorted({node.op_type for node in _all_nodes(model.graph)})
    facts["weight_map"] = weight_map(torch, onnx, model, ts_path, eager_module, spec, opset, out_path, dynamic_axes,
                                     facts["export_path"])
    return StageOutput(out_path, {"exporter": EXPORTERS[facts["export_path"]], **facts, "opset": opset,
                                  "nodes": len(model.graph.node), "op_types": op_types,
                                  "index_ranges": index_ranges(model),
                                  "dynamic_dims": dynamic_axes, "if_nodes": op_types.count("If")})


def weight_map(torch: Any, onnx: Any, model: Any, ts_path: Path, eager: Any, spec: NetworkSpec, opset: int,
               out_path: Path, dynamic_axes: dict[str, dict[int, str]], path: str) -> dict[str, Any]:
    """The refit map (rlopt.stages.weight_map): the same export path once more, from distinct sentinel weights."""
    import copy
    import tempfile

    from rlopt.stages.weight_map import build_weight_map, sentinel_state

    module = torch.jit.load(str(ts_path), map_location="cpu") if path == "script" else copy.deepcopy(eager).eval()
    marked = sentinel_state(module.state_dict())
    module.load_state_dict(marked)
    with tempfile.TemporaryDirectory(prefix="rlopt-weight-map-") as folder:
        sentinel_path = Path(folder) / out_path.name
        try:
            _export(torch, module, spec, opset, sentinel_path, dynamic_axes, dynamo=path == "dynamo")
        except Exception as exc:  # the exporter raises many types; the map is then absent, refit refuses
            return {"version": 1, "refused": f"the sentinel export failed: {refused_op(exc)}"}
        sentinel = onnx.load(str(sentinel_path))
    return build_weight_map(model, sentinel, {k: v.detach().cpu().numpy() for k, v in marked.items()})


def _all_nodes(graph: Any) -> list[Any]:
    """Every node, including those inside If/Loop/Scan bodies."""
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for attribute in node.attribute:
            if attribute.g.node:
                nodes.extend(_all_nodes(attribute.g))
            for sub in attribute.graphs:
                nodes.extend(_all_nodes(sub))
    return nodes


def _fallback(torch: Any, scripted: Any, eager: Any, spec: NetworkSpec, opset: int, out_path: Path,
              dynamic_axes: dict[str, dict[int, str]], facts: dict[str, Any], *, recipe_path: Path,
              network: str) -> str:
    """The trace, then the dynamo path, each refused with its reason; all refused is one StageError line."""
    refused = facts["refused"]
    where = f"networks.{network}"
    fix = "use operators the TorchScript exporter supports at this opset (recipe onnx.opset)"
    if eager is None:
        raise StageError(located(recipe_path, where, f"ONNX export failed: {refused}", fix))
    blockers = control_flow_blockers(scripted)
    if blockers:
        facts["fallback_refused"] = f"tracing would freeze the branch ({', '.join(blockers[:3])})"
        raise StageError(located(recipe_path, where,
                                 f"ONNX export of the scripted module failed ({refused}), and tracing the eager "
                                 f"module instead would freeze the data-dependent {blockers[0]}",
                                 "replace that operator, or move the branch out of the network "
                                 "(e.g. torch.where instead of if)"))
    try:
        _export(torch, eager.eval(), spec, opset, out_path, dynamic_axes)
        return "trace"
    except Exception as exc:  # the exporter raises many types for unsupported operators
        traced = refused_op(exc)
        facts["trace_refused"] = traced
    reason = _dynamo_unavailable()
    if reason is None:
        try:
            _export(torch, eager.eval(), spec, opset, out_path, dynamic_axes, dynamo=True)
            return "dynamo"
        except Exception as exc:  # the dynamo exporter raises many types too
            reason = refused_op(exc)
    facts["dynamo_refused"] = reason
    raise StageError(located(recipe_path, where,
                             f"ONNX export failed: scripted: {refused}; traced: {traced}; dynamo: {reason}", fix))
