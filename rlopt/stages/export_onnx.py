"""Stage 2: ONNX from the scripted module, so that `if x.size(0) > 1` survives as an If node.

The dynamo exporter specializes such branches silently (see shared notes); the TorchScript-based
exporter keeps them. Dynamic dims are named; one self-contained file; checked by onnx.checker.

Export chain, first that works wins (facts: `export_path`; `refused`, `trace_refused`, `dynamo_refused` for
what each earlier path refused, or froze):
1. `script`: the scripted module (keeps data-dependent branches).
2. `trace`: the eager module traced by the same exporter, where the scripted graph has an op the TorchScript
   exporter refuses (a scripted GRUCell's prim::ListConstruct, TransformerEncoder's aten::is_autocast_enabled).
   Not tried when the network's own code branches or loops on values or shapes (a trace freezes that branch);
   library internals (nn.LSTM's `batch_first` checks) and conditions on constants and attributes are fine.
3. `dynamo`: torch.onnx.export(dynamo=True, dynamic_shapes=Dim.AUTO per dynamic dim) from the eager module.
Each exported graph must then pass the shape probe (rlopt.stages.shape_probe: run at batch 1 and > 1, every
named length and one unnamed length, against PyTorch); a graph that froze a dim passes the turn to the next
path. Where none keeps a dim dynamic, compile refuses in one line naming the dim (fix: make it static).
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
from rlopt.stages.control_flow import control_flow_blockers

EXPORTER = "torch.onnx.export (TorchScript-based, dynamo=False) from the scripted module"
EXPORTERS = {
    "script": EXPORTER,
    "trace": "torch.onnx.export (TorchScript-based, dynamo=False) tracing the eager module",
    "dynamo": "torch.onnx.export (dynamo=True) from the eager module",
}
_OP = re.compile(r"\b(?:aten|prim|onnx|quantized|_caffe2)::\w+")
_NAMED_OP = re.compile(r"operator '?([\w:.]+)'?|'(\w+::\w+)'")
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


def _example_tensor(torch: Any, dtype_name: str, shape: list[int]) -> Any:
    dtype = getattr(torch, dtype_name)
    return torch.zeros(shape, dtype=dtype) if dtype in (torch.bool, torch.uint8) else torch.ones(shape, dtype=dtype)


def example_inputs(inputs: dict[str, InputSpec], point: str = "opt") -> tuple:
    torch = require("torch")
    return tuple(_example_tensor(torch, spec.dtype, spec.dims(point)) for spec in inputs.values())


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


def _dynamo_unavailable() -> str | None:
    try:
        import onnxscript  # noqa: F401
    except ImportError:
        return "the dynamo exporter needs onnxscript, which is not installed (pip install onnxscript)"
    return None


def _dynamo_example(spec: NetworkSpec) -> dict[str, list[int]]:
    """torch.export's example shapes: opt, but a dynamic dim whose opt is 1 takes its max (torch.export
    specializes a dim it sees as 1). Equal ranges give equal values, so dims that must agree still do."""
    shapes = {}
    for name, input_spec in spec.inputs.items():
        dims = input_spec.dims("opt")
        for axis in input_spec.dynamic_axes:
            if dims[axis] == 1:
                dims[axis] = input_spec.dims("max")[axis]
        shapes[name] = dims
    return shapes


def _name_dims(path: Path, dynamic_axes: dict[str, dict[int, str]]) -> None:
    """Rename the dynamo exporter's dim symbols (`s52`) to the names the other paths give (`batch`, `obs_d1`)."""
    import onnx

    model = onnx.load(str(path))
    renamed: dict[str, str] = {}
    for value in model.graph.input:
        for axis, name in dynamic_axes.get(value.name, {}).items():
            dims = value.type.tensor_type.shape.dim
            if axis < len(dims) and dims[axis].dim_param:
                renamed.setdefault(dims[axis].dim_param, name)
    if not renamed:
        return
    for value in [*model.graph.input, *model.graph.output, *model.graph.value_info]:
        for dim in value.type.tensor_type.shape.dim:
            if dim.dim_param in renamed:
                dim.dim_param = renamed[dim.dim_param]
    onnx.save(model, str(path))


def _export(torch: Any, module: Any, spec: NetworkSpec, opset: int, out_path: Path,
            dynamic_axes: dict[str, dict[int, str]], *, dynamo: bool = False) -> None:
    with warnings.catch_warnings(), quiet_file_descriptors():
        warnings.simplefilter("ignore")
        if dynamo:
            from torch.export import Dim

            # positional (a tuple in forward's argument order): the recipe's input names need not be forward's;
            # Dim.AUTO rather than named Dims: it finds which dims must be equal (a mask's and the observation's)
            shapes = tuple({axis: Dim.AUTO for axis in dynamic_axes.get(name, {})} or None for name in spec.inputs)
            example = _dynamo_example(spec)
            tensors = tuple(_example_tensor(torch, s.dtype, example[n]) for n, s in spec.inputs.items())
            torch.onnx.export(module, tensors, str(out_path), dynamo=True, verbose=False,
                              input_names=list(spec.inputs), output_names=list(spec.outputs),
                              dynamic_shapes=shapes, opset_version=opset, external_data=False, optimize=False)
            _name_dims(out_path, dynamic_axes)
        else:
            torch.onnx.export(module, example_inputs(spec.inputs), str(out_path), dynamo=False,
                              input_names=list(spec.inputs), output_names=list(spec.outputs),
                              dynamic_axes=dynamic_axes, opset_version=opset, do_constant_folding=True)


REFUSED_FACT = {"script": "refused", "trace": "trace_refused", "dynamo": "dynamo_refused"}


def export_onnx(ts_path: Path, spec: NetworkSpec, opset: int, out_path: Path, *, recipe_path: Path,
                network: str, eager_module: Any = None, tolerance: tuple[float, float] = (1e-4, 1e-3)) -> StageOutput:
    """ONNX from the scripted module; where the exporter refuses one of its ops or the graph freezes a dynamic dim,
    from the eager module (see the module docstring). `eager_module` is the network's nn.Module (needed for the
    fallbacks); `tolerance` (atol, rtol) is what the shape probe allows against PyTorch."""
    torch = require("torch")
    onnx = require("onnx")
    scripted = torch.jit.load(str(ts_path), map_location="cpu")
    dynamic_axes = {name: axes for name, axes in dynamic_dim_names(spec.inputs).items() if axes}
    facts: dict[str, Any] = {}
    facts["export_path"] = _export_chain(torch, scripted, eager_module, spec, opset, out_path, dynamic_axes, facts,
                                         tolerance, recipe_path=recipe_path, network=network)
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


def _not_tried(path: str, scripted: Any) -> str | None:
    """Why an export path is not tried here, or None."""
    if path == "trace":
        blockers = control_flow_blockers(scripted)
        return f"tracing would freeze the data-dependent {', '.join(blockers[:3])}" if blockers else None
    if path == "dynamo":
        return _dynamo_unavailable()
    return None


def _export_chain(torch: Any, scripted: Any, eager: Any, spec: NetworkSpec, opset: int, out_path: Path,
                  dynamic_axes: dict[str, dict[int, str]], facts: dict[str, Any], tolerance: tuple[float, float], *,
                  recipe_path: Path, network: str) -> str:
    """The first export path whose graph passes the shape probe; each other one's reason goes into `facts`."""
    from rlopt.stages.shape_probe import probe_export

    attempts = [("script", scripted)] + ([("trace", eager), ("dynamo", eager)] if eager is not None else [])
    reference = eager.eval() if eager is not None else scripted
    frozen, short = "", {}
    for path, module in attempts:
        reason = _not_tried(path, scripted)
        if reason is None:
            try:
                _export(torch, module.eval(), spec, opset, out_path, dynamic_axes, dynamo=path == "dynamo")
            except Exception as exc:  # the exporters raise many types for unsupported operators
                reason = refused_op(exc)
        if reason is None:
            probe = probe_export(out_path, reference, spec, *tolerance)
            if probe.failed is None:
                facts["shape_probe"] = probe.facts()
                return path
            frozen = probe.failed.dim or probe.failed.label
            reason = f"the graph does not match PyTorch at {probe.failed.label}: {probe.problem}"
            short[path] = f"froze it (does not match PyTorch at {probe.failed.label})"
        facts[REFUSED_FACT[path]] = reason
    out_path.unlink(missing_ok=True)
    raise StageError(_refusal(spec, {**facts, **{REFUSED_FACT[p]: r for p, r in short.items()}}, frozen,
                              eager is not None, recipe_path=recipe_path, network=network))


def _short_reason(text: str, limit: int = 140) -> str:
    return text if len(text) <= limit else text[:limit - 3] + "..."


def _refusal(spec: NetworkSpec, facts: dict[str, Any], frozen: str, fallbacks: bool, *, recipe_path: Path,
             network: str) -> str:
    """The one line for an export no path could make: the dim no exporter kept dynamic, else each path's error."""
    where = f"networks.{network}"
    tried = "; ".join(f"{label}: {_short_reason(facts[key])}" for label, key in
                      (("scripted", "refused"), ("traced", "trace_refused"), ("dynamo", "dynamo_refused"))
                      if key in facts)
    if frozen.startswith("input '"):
        name, axis = frozen.split("'")[1], int(frozen.rsplit(" ", 1)[1])
        lo, hi = spec.inputs[name].dims("min")[axis], spec.inputs[name].dims("max")[axis]
        return located(recipe_path, where, f"no ONNX exporter keeps {frozen} ({lo}..{hi}) dynamic: {tried}",
                       f"make {frozen} static in the recipe (min = opt = max), or make forward shape-generic "
                       "along it")
    if frozen:  # each dim alone ran; the named shape that varies them together did not
        return located(recipe_path, where, f"no ONNX exporter gives a graph that matches PyTorch at {frozen}: "
                       f"{tried}", "make the dims that vary there static in the recipe (min = opt = max), or "
                       "make forward shape-generic along them")
    if not fallbacks:
        return located(recipe_path, where, f"ONNX export failed: {facts['refused']}",
                       "use operators the TorchScript exporter supports at this opset (recipe onnx.opset)")
    fix = "use operators the TorchScript exporter supports at this opset (recipe onnx.opset)"
    if facts.get("trace_refused", "").startswith("tracing would freeze"):
        fix = "replace that operator, or move the branch out of the network (e.g. torch.where instead of if)"
    return located(recipe_path, where, f"ONNX export failed: {tried}", fix)
