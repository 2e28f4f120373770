"""ONNX -> fused Relax IRModule, at the network's dynamic shape or at one static shape.

Shared by the TVM build stage and by tuning (rlopt/tuning.py), so that the workloads tuning
extracts are exactly the kernels the build later looks up in the database.

Three measured traps shape it (shared notes, and checked by tests):
- Relax's ONNX frontend cannot compare a symbolic shape scalar (`Gather(Shape(x), 0) > 1`, the
  batch-vs-single branch): `tensorize_shape_comparisons` rewrites that Gather into a tensor form.
- The frontend emits BOTH branches of an ONNX `If` into the outer block, so every call computes
  both paths. At a static shape the condition is known: `fold_static_ifs` inlines the taken
  branch before import, and the other path disappears.
- A graph with an If imports without dataflow blocks, so nothing fuses, and
  `get_default_pipeline` then miscompiles the If. `ConvertToDataflow` followed by the "zero"
  pipeline fuses and is exact.
- tanh/exp/erf become their fast vectorizable forms (FastMathTransform), sigmoid goes through fast_tanh
  (fast_sigmoid.py), see import_relax.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np

from rlopt.lazy import require

COMPARISONS = {"Greater", "Less", "Equal", "GreaterOrEqual", "LessOrEqual"}
CONTROL_FLOW = {"If", "Loop", "Scan"}
Shapes = dict[str, list[int]]
# TVM's te.TagScope (entered by every topi compute that Relax legalization calls) is one process-global
# slot: two imports legalizing at once fail with "nested op_tag is not allowed for now" or a bare
# AssertionError (seen in tvm_build's thread pool under load; with weights as parameters from_onnx itself raised
# one too). Whole imports take turns; compiles stay parallel.
_IMPORT_LOCK = threading.Lock()


def _constant_values(graph: Any) -> dict[str, np.ndarray]:
    from onnx import numpy_helper

    values = {init.name: numpy_helper.to_array(init) for init in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            values[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return values


def tensorize_shape_comparisons(model: Any) -> int:
    """Rewrite `Gather(Shape(x), scalar)` feeding only comparisons into `Squeeze(Gather(Shape(x), [i]))`.

    Same values, but a tensor instead of a symbolic scalar. Returns the number of rewrites.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    shapes = {out for node in graph.node if node.op_type == "Shape" for out in node.output}
    constants = _constant_values(graph)
    consumers: dict[str, list[Any]] = {}
    for node in graph.node:
        for name in node.input:
            consumers.setdefault(name, []).append(node)
    rewritten: list[Any] = []
    count = 0
    for node in graph.node:
        index = constants.get(node.input[1]) if node.op_type == "Gather" and len(node.input) > 1 else None
        users = consumers.get(node.output[0], []) if node.output else []
        if (index is not None and index.ndim == 0 and node.input[0] in shapes and users
                and all(user.op_type in COMPARISONS for user in users)):
            vector_index, gathered = f"{node.output[0]}__index1d", f"{node.output[0]}__gathered1d"
            rewritten.append(helper.make_node("Constant", [], [vector_index],
                                              value=numpy_helper.from_array(index.reshape(1).astype(index.dtype))))
            rewritten.append(helper.make_node("Gather", [node.input[0], vector_index], [gathered], axis=0))
            rewritten.append(helper.make_node("Squeeze", [gathered], [node.output[0]]))
            count += 1
        else:
            rewritten.append(node)
    del graph.node[:]
    graph.node.extend(rewritten)
    return count


def pretranspose_gemm_weights(model: Any) -> int:
    """Give `Gemm(transB=1)` with a constant B (nn.Linear on 2-D input) a transposed copy of B and transB=0.

    The kernel TVM builds is the same matmul on the same constant, but without this TVM's FoldConstant
    builds and runs a transpose kernel per weight with LLVM at every import. Returns the count.
    """
    from onnx import helper, numpy_helper

    graph = model.graph
    initializers = {init.name: init for init in graph.initializer}
    made: dict[str, str] = {}
    count = 0

    def visit(nodes: Any) -> None:
        nonlocal count
        for node in nodes:
            for attribute in node.attribute:
                if attribute.g.node:
                    visit(attribute.g.node)
            if node.op_type != "Gemm" or len(node.input) < 2 or node.input[1] not in initializers:
                continue
            trans_b = next((a for a in node.attribute if a.name == "transB"), None)
            if trans_b is None or trans_b.i != 1:
                continue
            source = node.input[1]
            if source not in made:
                made[source] = f"{source}__transposed"
                weight = numpy_helper.to_array(initializers[source])
                graph.initializer.append(numpy_helper.from_array(np.ascontiguousarray(weight.T), made[source]))
            node.input[1] = made[source]
            node.attribute.remove(trans_b)
            node.attribute.append(helper.make_attribute("transB", 0))
            count += 1

    visit(graph.node)
    return count


def _shape_only_cone(graph: Any, value: str) -> list[Any] | None:
    """The nodes that compute `value`, if they read graph inputs only through `Shape`; else None."""
    producers = {out: node for node in graph.node for out in node.output}
    graph_inputs = {i.name for i in graph.input}
    cone: dict[int, Any] = {}
    pending = [value]
    while pending:
        name = pending.pop()
        node = producers.get(name)
        if node is None or id(node) in cone:
            continue
        if node.op_type in CONTROL_FLOW:
            return None
        if node.op_type != "Shape" and any(i in graph_inputs for i in node.input):
            return None
        cone[id(node)] = node
        if node.op_type != "Shape":
            pending.extend(i for i in node.input if i)
    order = {id(node): index for index, node in enumerate(graph.node)}
    return sorted(cone.values(), key=lambda node: order[id(node)])


def _evaluate_condition(model: Any, cone: list[Any], condition: str, shapes: Shapes) -> bool | None:
    """Run the shape-only cone on zero inputs of the static shapes (values do not matter, shapes do)."""
    from onnx import TensorProto, helper
    from onnx.helper import tensor_dtype_to_np_dtype
    from onnx.reference import ReferenceEvaluator

    graph = model.graph
    used = {i for node in cone for i in node.input}
    inputs = [i for i in graph.input if i.name in used]
    if any(i.name not in shapes for i in inputs):
        return None
    initializers = [init for init in graph.initializer if init.name in used]
    sub = helper.make_model(
        helper.make_graph(cone, "condition", inputs, [helper.make_tensor_value_info(condition, TensorProto.BOOL, None)],
                          initializer=initializers),
        opset_imports=model.opset_import)
    feeds = {i.name: np.zeros(shapes[i.name], dtype=tensor_dtype_to_np_dtype(i.type.tensor_type.elem_type))
             for i in inputs}
    try:
        (result,) = ReferenceEvaluator(sub).run(None, feeds)
    except Exception:  # the reference evaluator raises many types; an unknown condition just stays an If
        return None
    result = np.asarray(result)
    return bool(result.reshape(-1)[0]) if result.size == 1 else None


def fold_static_ifs(model: Any, shapes: Shapes) -> int:
    """Inline the taken branch of every top-level If whose condition depends only on input shapes.

    Returns the number of Ifs folded. Branch-local names that clash with the outer graph are renamed.
    """
    from onnx import helper

    graph = model.graph
    folded = 0
    for node in list(graph.node):
        if node.op_type != "If":
            continue
        cone = _shape_only_cone(graph, node.input[0])
        taken = None if cone is None else _evaluate_condition(model, cone, node.input[0], shapes)
        if taken is None:
            continue
        branch = next(a.g for a in node.attribute if a.name == ("then_branch" if taken else "else_branch"))
        existing = {name for n in graph.node for name in n.output} | {i.name for i in graph.initializer}
        existing |= {i.name for i in graph.input}
        local = {name for n in branch.node for name in n.output} | {i.name for i in branch.initializer}
        renamed = {name: f"{name}__if{folded}" for name in local if name in existing}
        inlined = []
        for inner in branch.node:
            copy = helper.make_node(inner.op_type, [renamed.get(i, i) for i in inner.input],
                                    [renamed.get(o, o) for o in inner.output], name=f"{inner.name}__if{folded}",
                                    domain=inner.domain)
            copy.attribute.extend(inner.attribute)
            inlined.append(copy)
        for init in branch.initializer:
            copy_init = graph.initializer.add()
            copy_init.CopyFrom(init)
            copy_init.name = renamed.get(init.name, init.name)
        for source, target in zip(branch.output, node.output):
            inlined.append(helper.make_node("Identity", [renamed.get(source.name, source.name)], [target]))
        position = list(graph.node).index(node)
        nodes = list(graph.node)
        nodes[position:position + 1] = inlined
        del graph.node[:]
        graph.node.extend(nodes)
        folded += 1
    return folded


def drop_dead_nodes(graph: Any) -> int:
    """Remove nodes and initializers no graph output depends on (a folded If's condition, the other branch's weights).

    Left in, TVM's FoldConstant builds and runs each dead shape kernel with LLVM at import (~40 ms apiece).
    Returns the number of nodes removed.
    """
    producers = {out: node for node in graph.node for out in node.output}
    needed: set[str] = set()
    live: set[int] = set()
    pending = [o.name for o in graph.output]
    while pending:
        name = pending.pop()
        if name in needed:
            continue
        needed.add(name)
        node = producers.get(name)
        if node is not None and id(node) not in live:
            live.add(id(node))
            pending.extend(i for i in node.input if i)
            for attribute in node.attribute:  # names a subgraph reads from the outer scope
                if attribute.g.node:
                    pending.extend(i for n in attribute.g.node for i in n.input if i)
    kept = [node for node in graph.node if id(node) in live]
    removed = len(graph.node) - len(kept)
    if removed:
        del graph.node[:]
        graph.node.extend(kept)
    unused = [init for init in graph.initializer if init.name not in needed]
    for init in unused:
        graph.initializer.remove(init)
    return removed


def fused_kernels(mod: Any) -> list[str]:
    return sorted(gv.name_hint for gv in mod.functions if gv.name_hint.startswith("fused_"))


def scheduled_kernels(mod: Any) -> tuple[list[str], list[str]]:
    """(scheduled, unscheduled) PrimFunc names: a kernel that got a tuning record carries `tirx.is_scheduled`."""
    tirx = require("tvm.tirx")
    scheduled, unscheduled = [], []
    for gv, func in mod.functions.items():
        if isinstance(func, tirx.PrimFunc):
            attrs = func.attrs
            done = attrs is not None and bool(attrs.get("tirx.is_scheduled", False))
            (scheduled if done else unscheduled).append(gv.name_hint)
    return sorted(scheduled), sorted(unscheduled)


def prepare_onnx(onnx_model: Any, shapes: Shapes | None = None,
                 bounds: tuple[Shapes, Shapes] | None = None) -> tuple[Any, dict[str, Any]]:
    """A copy of `onnx_model` rewritten for import (dynamo's constant forms, LSTM/GRU/RNN unrolled, shape
    comparisons, static Ifs, Gemm weights, dead nodes). `bounds` (min, max shapes) size a dynamic sequence.

    Deterministic, so refit rebuilds the same initializers from a graph with new weights."""
    from rlopt.backends.tvm.normalize import constants_as_tensors, scalar_reshapes_as_unsqueeze
    from rlopt.backends.tvm.recurrent import expand_recurrent

    onnx = require("onnx")
    model = onnx.ModelProto()
    model.CopyFrom(onnx_model)
    constants_as_tensors(model.graph)
    scalar_reshapes_as_unsqueeze(model)
    facts: dict[str, Any] = {"recurrent_unrolled": expand_recurrent(model, shapes, bounds),
                             "shape_comparisons_tensorized": tensorize_shape_comparisons(model)}
    if shapes is not None:
        facts["ifs_folded"] = fold_static_ifs(model, shapes)
    pretranspose_gemm_weights(model)
    drop_dead_nodes(model.graph)
    return model, facts


def split_weights(model: Any) -> dict[str, np.ndarray]:
    """The floating-point initializers (the weights), in graph order; every other initializer becomes a Constant
    node of `model`, so shape data stays baked into the code and only weights become parameters."""
    from onnx import helper, numpy_helper

    weights: dict[str, np.ndarray] = {}
    baked = []
    for init in list(model.graph.initializer):
        array = numpy_helper.to_array(init)
        if np.issubdtype(array.dtype, np.floating):
            weights[init.name] = array
        else:
            baked.append(helper.make_node("Constant", [], [init.name], value=init))
            model.graph.initializer.remove(init)
    if baked:
        nodes = baked + list(model.graph.node)
        del model.graph.node[:]
        model.graph.node.extend(nodes)
    return weights


def import_relax(onnx_model: Any, target: Any, shapes: Shapes | None = None, *, weights_as_params: bool = False,
                 bounds: tuple[Shapes, Shapes] | None = None) -> tuple[Any, dict[str, Any]]:
    """A fused Relax IRModule (dynamic when `shapes` is None, else static at `shapes`) and import facts.

    With `weights_as_params`, `main` takes the weights after the inputs and facts["params"] holds them (name ->
    array, in that order) for the caller to store; the kernels are the same as with baked weights, so tuning
    records apply to both. `onnx_model` is not modified.
    """
    from rlopt.backends.tvm.normalize import check_supported

    relax = require("tvm.relax")
    from_onnx = require("tvm.relax.frontend.onnx").from_onnx
    from rlopt.backends.tvm.fast_sigmoid import fast_sigmoid

    model, facts = prepare_onnx(onnx_model, shapes, bounds)
    check_supported(model)  # after the rewrites: an LSTM they unrolled is no longer there
    if weights_as_params:
        facts["params"] = split_weights(model)
    with _IMPORT_LOCK:
        mod = from_onnx(model, shape_dict=dict(shapes) if shapes else None, keep_params_in_input=weights_as_params)
        if weights_as_params:
            mod, _ = relax.frontend.detach_params(mod)  # the values stay out of the library
        mod = relax.transform.ConvertToDataflow(min_size=1)(mod)
        # tanh/exp/erf lower to scalar libm calls per element (tanh was ~60% of the tuned value head at
        # [8,16,768]); the fast forms vectorize, differ by ~3e-7 here, and the parity gate checks them anyway
        mod = fast_sigmoid(relax.transform.FastMathTransform()(mod))
        facts["fast_math"] = True
        with target:
            mod = _fused_with_params(mod) if weights_as_params else relax.get_pipeline("zero")(mod)
        if shapes is not None:
            # weights may be re-laid-out by a tuned schedule (packed tiles): 52 vs 75 us for the tuned default
            # policy at [4,8,768]; baked weights (constants) and parameters after `num_input` are both layout-free
            mod = relax.transform.AttachAttrLayoutFreeBuffers()(mod)
            facts["weight_prepack"] = True
        facts["fused_kernels"] = fused_kernels(mod)
    return mod, facts


def _fused_with_params(mod: Any) -> Any:
    """The "zero" pipeline, with what is computed from weights alone (a Conv bias reshaped, ...) lifted out of
    `main` into PREPARE before fusion. Baked weights get that folded into constants; lifting it leaves `main`
    with the same kernels, so tuning records made on either apply to both (a bias reshape fused into a conv
    kernel would be a new workload: the Atari CNN's three convs lost their records that way)."""
    from rlopt.backends.tvm.params import PREPARE

    tvm = require("tvm")
    relax = require("tvm.relax")
    mod = tvm.transform.Sequential([relax.transform.LegalizeOps(), relax.transform.AnnotateTIROpPattern(),
                                    relax.transform.FoldConstant(), relax.transform.LiftTransformParams()])(mod)
    lifted = mod.get_global_var("main_transform_params")
    functions = {gv: func for gv, func in mod.functions_items() if not gv.same_as(lifted)}
    # no num_input: the pre-packing lift (fold_weight_layouts) must leave this function alone
    functions[tvm.ir.GlobalVar(PREPARE)] = mod[lifted].with_attr("global_symbol", PREPARE).without_attr("num_input")
    mod = tvm.IRModule(functions, attrs=mod.attrs)
    return tvm.transform.Sequential([relax.transform.FuseOps(), relax.transform.FuseTIR()])(mod)


def fold_weight_layouts(mod: Any, weights_as_params: bool = False) -> Any:
    """After a tuning database is applied: split each kernel's weight-layout rewrite into its own function and
    run it on the constant weights now (FoldConstant), or with weights as parameters lift it, with anything
    else computed from weights alone, into `main_transform_params`, run once on the weights when a library is
    opened; either way calls read pre-packed weights and never re-pack."""
    relax = require("tvm.relax")
    mod = relax.transform.SplitLayoutRewritePreproc()(mod)
    mod = relax.transform.LiftTransformParams()(mod) if weights_as_params else relax.transform.FoldConstant()(mod)
    return relax.transform.DeadCodeElimination()(mod)
