"""A product reduced over shared iterators, C[b.., m.., n] += A[b.., m.., k..] * B[b.., k.., n] in any layout
(a matmul, or a convolution read straight from its input: im2col without the copy), scheduled with the micro-kernel
of gemm.py.

The kernel is first brought to a canonical iteration space: batch iterators (both operands), M (the iterators only
A reads, fused), N (the one iterator only B reads) and the reduction iterators, with the accumulator and the
epilogue laid out as [batch.., M, N], so that every tile is a rectangle there. A weight B (a `layout_free_buffers`
parameter) is packed into panels of one tile's columns, contiguous along the reduction; the packing is marked as a
layout rewrite, so the importer lifts it out of the call into `main_transform_params`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from rlopt.backends.tvm.schedules.blocks import (Refused, inline_producers, only_reduction, single_epilogue,
                                                 static_extent)
from rlopt.backends.tvm.schedules.gemm import Tile, gemm_tile
from rlopt.backends.tvm.schedules.target import VectorUnit
from rlopt.lazy import require

PARALLEL_MIN_MACS = 1 << 21  # ~15 us on one core: a fork-join of TVM's pool (~1-2 us with spinning workers) pays
PARALLEL_MIN_BYTES = 1 << 20  # a weight of 1 MB or more streams from L2 or beyond at a core's bandwidth


@dataclass
class Roles:
    """Which block iterator plays which part, each list in block order; `plain_a`: A is indexed by iterators
    alone (a matmul), not by expressions of them (a convolution's window)."""

    iters: list[Any]
    extents: list[Any]
    batch: list[Any]
    rows: list[Any]
    col: Any
    reduce: list[Any]
    out: list[Any]
    b_read: int
    b_vars: list[Any]
    b_packable: bool
    plain_a: bool


def _used(exprs: list[Any], candidates: list[Any]) -> list[Any]:
    """The candidates (block iterators) the expressions read."""
    undefined_vars = require("tvm.tirx.analysis").undefined_vars
    found = [v for e in exprs for v in undefined_vars(e)]
    return [c for c in candidates if any(v.same_as(c) for v in found)]


def _in(var: Any, group: list[Any]) -> bool:
    return any(var.same_as(other) for other in group)


def _layout_free(func: Any, buffer: Any) -> bool:
    """A parameter the kernel may re-lay-out (a weight: listed in `layout_free_buffers`)."""
    attrs = func.attrs
    free = [int(i) for i in (attrs.get("layout_free_buffers", []) if attrs is not None else [])]
    return any(i < len(func.params) and func.params[i].name == buffer.name for i in free)


def roles(sch: Any, block: Any, func: Any) -> Roles:
    """The block's iterators sorted into batch, rows (M), the column (N) and the reduction; Refused if it is not a
    two-operand product with one column iterator."""
    tirx = require("tvm.tirx")
    from tvm import ir

    stmt = sch.get(block)
    if len(stmt.writes) != 1:
        raise Refused("several outputs")
    written = stmt.writes[0]
    out = [r.min for r in written.region]
    if not all(ir.is_prim_var(v) for v in out) or len({v.name for v in out}) != len(out):
        raise Refused("output not indexed by plain iterators")
    operands = [(i, r) for i, r in enumerate(stmt.reads) if not r.source.same_as(written.source)]
    if len(operands) != 2:
        raise Refused(f"{len(operands)} operands, not two")
    iters = [iv.var for iv in stmt.iter_vars]
    extents = [iv.dom.extent for iv in stmt.iter_vars]
    reduce = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.CommReduce]
    spatial = [iv.var for iv in stmt.iter_vars if iv.iter_type == tirx.IterVar.DataPar]
    if any(not _in(v, out) for v in spatial):
        raise Refused("a spatial iterator the output is not indexed by")
    uses = [(i, r, _used([x.min for x in r.region], iters)) for i, r in operands]
    for var in reduce:
        if not all(_in(var, used) for _, _, used in uses):
            raise Refused("a reduction iterator one operand does not read")
    only = [[v for v in spatial if _in(v, used) and not any(_in(v, u) for _, _, u in uses if u is not used)]
            for _, _, used in uses]
    weight = [k for k, (_, r, _) in enumerate(uses) if _layout_free(func, r.source)]
    b_side = weight[0] if len(weight) == 1 else next((k for k, o in enumerate(only) if o and o[-1].same_as(out[-1])),
                                                     None)
    if b_side is None or len(only[b_side]) != 1:
        raise Refused("no single output iterator that only one operand reads (the N of a matmul)")
    col = only[b_side][0]
    b_index, b_region, _ = uses[b_side]
    _, a_region, a_used = uses[1 - b_side]
    batch = [v for v in spatial if all(_in(v, u) for _, _, u in uses)]
    rows = [v for v in out if _in(v, a_used) and not _in(v, batch) and not v.same_as(col)]
    if len(batch) + len(rows) + 1 != len(spatial):
        raise Refused("a spatial iterator neither operand reads")
    b_vars = [r.min for r in b_region.region]
    plain_b = all(ir.is_prim_var(v) and static_extent(r.extent) == 1 for v, r in zip(b_vars, b_region.region))
    packable = (plain_b and not batch and _layout_free(func, b_region.source)
                and all(_in(v, reduce) or v.same_as(col) for v in b_vars))
    contiguous = (plain_b and len(reduce) == 1 and len(b_vars) >= 2 and b_vars[-1].same_as(col)
                  and b_vars[-2].same_as(reduce[0]))
    if not packable and not contiguous:
        raise Refused("B is neither a weight that can be packed nor contiguous along N after K")
    plain_a = all(ir.is_prim_var(r.min) for r in a_region.region)
    return Roles(iters, extents, batch, rows, col, reduce, out, b_index, b_vars, packable, plain_a)


def _index_map(arity: int, mapping: Any) -> Any:
    return require("tvm.tirx").IndexMap.from_func(mapping, ndim=arity)


def _substitute(expr: Any, values: dict[Any, Any]) -> Any:
    return require("tvm.tirx.stmt_functor").substitute(expr, values)


def _canonical(r: Roles) -> Any:
    """(vars in some order) -> [*batch, M, N] over the output's own index order, as a function of a var binding."""
    def fused(env: dict[str, Any]) -> Any:
        value = None
        for var in r.rows:
            extent = r.extents[[i.name for i in r.iters].index(var.name)]
            value = env[var.name] if value is None else value * extent + env[var.name]
        return value

    return fused


def canonicalize(sch: Any, block: Any, epilogue: Any, r: Roles) -> None:
    """Lay the accumulator out as [*batch, M, N] and iterate the block over (*batch, M, N, *reduce) and the
    epilogue over (*batch, M, N)."""
    m_of = _canonical(r)
    names = [v.name for v in r.out]
    zero = require("tvm.tirx").const(0, "int64")

    def out_map(*dims: Any) -> list[Any]:
        env = dict(zip(names, dims))
        m = m_of(env) if r.rows else zero
        return [env[v.name] for v in r.batch] + [m, env[r.col.name]]

    epi_stmt = sch.get(epilogue)
    from tvm import ir

    reads = [rd for rd in epi_stmt.reads if rd.source.same_as(sch.get(block).writes[0].source)]
    if len(reads) != 1 or not all(ir.is_prim_var(x.min) for x in reads[0].region):
        raise Refused("the epilogue does not read the product element-wise")
    epi_dims = [x.min.name for x in reads[0].region]
    epi_iters = [iv.var.name for iv in epi_stmt.iter_vars]
    if sorted(epi_dims) != sorted(epi_iters):
        raise Refused("the epilogue iterates over more than the product")
    sch.transform_layout(block, ("write", 0), _index_map(len(names), out_map))
    iter_names = [v.name for v in r.iters]

    def block_map(*values: Any) -> list[Any]:
        env = dict(zip(iter_names, values))
        m = m_of(env) if r.rows else zero
        return [env[v.name] for v in r.batch] + [m, env[r.col.name]] + [env[v.name] for v in r.reduce]

    sch.transform_block_layout(block, _index_map(len(iter_names), block_map))

    def epilogue_map(*values: Any) -> list[Any]:
        by_iter = dict(zip(epi_iters, values))
        return out_map(*[by_iter[d] for d in epi_dims])

    sch.transform_block_layout(epilogue, _index_map(len(epi_iters), epilogue_map))


def pack_weight(sch: Any, block: Any, r: Roles, width: int) -> None:
    """B as panels [N // width, K, width], K the reduction iterators fused in block order."""
    reduce_names = [v.name for v in r.reduce]
    extents = {v.name: r.extents[[i.name for i in r.iters].index(v.name)] for v in r.reduce}
    dims = [v.name for v in r.b_vars]

    def panels(*values: Any) -> list[Any]:
        env = dict(zip(dims, values))
        k = None
        for name in reduce_names:
            k = env[name] if k is None else k * extents[name] + env[name]
        n = env[r.col.name]
        return [n // width, k, n % width]

    packed = sch.cache_read(block, r.b_read, "global")
    sch.transform_layout(block, ("read", r.b_read), _index_map(len(dims), panels))
    sch.annotate(packed, "meta_schedule.layout_rewrite_preproc", True)


def vectorize_inner(sch: Any, block: Any, lanes: int, outer: int = 0) -> None:
    """Vectorize a block's innermost loop by `lanes` where it divides it (else leave it to LLVM); only a loop that
    holds nothing but this block, and none of its first `outer` loops (TVM's vectorizer miscompiles a loop with
    a reduction nested inside: the schedule check lets it pass)."""
    loops = sch.get_loops(block)
    if len(loops) <= outer:
        return
    inner = loops[-1]
    children = sch.get_child_blocks(inner)
    if len(children) != 1:
        return
    extent = static_extent(sch.get(inner).extent)
    if extent is None or extent % lanes:
        return
    if extent > lanes:
        inner = sch.split(inner, [None, lanes])[1]
    sch.vectorize(inner)


def schedule_tile(sch: Any, block: Any, tile: Tile, epilogue: Any, n_batch: int, n_reduce: int,
                  contiguous_out: bool, parallel: bool) -> None:
    """Tile the canonical (*batch, M, N, *reduce) loops by `tile`; the epilogue runs per tile. With `parallel`,
    the tiles (column panels outermost, so each thread streams its own share of the weight) are split among
    TVM's threads."""
    loops = sch.get_loops(block)
    outer, (m, n), ks = loops[:n_batch], loops[n_batch:n_batch + 2], loops[n_batch + 2:]
    assert len(ks) == n_reduce
    mo, mi = sch.split(m, [None, tile.rows])
    no, ni = sch.split(n, [None, tile.width])
    nj, lane = sch.split(ni, [None, tile.lanes])
    sch.reorder(*outer, no, mo, *ks, mi, nj, lane)
    sch.reverse_compute_at(epilogue, mo, preserve_unit_loops=True)
    if parallel:
        sch.parallel(sch.fuse(*outer, no, mo))
    if contiguous_out:
        vectorize_inner(sch, epilogue, tile.lanes)
    else:
        # a convolution's output is contiguous along the tile's rows (output positions), not its columns (output
        # channels): the epilogue walks the rows innermost, as one vector (measured 2.7x on a 3x3 16->32 conv at
        # [8, 16, 34, 34], where the scalar epilogue cost as much as the products)
        rows, cols = sch.get_loops(epilogue)[-2:]
        sch.reorder(cols, rows)
        sch.vectorize(rows)
    sch.unroll(mi)
    sch.unroll(nj)
    sch.vectorize(lane)
    sch.decompose_reduction(block, ks[0])


def schedule(func: Any, unit: VectorUnit, conv: bool) -> Any:
    """The scheduled kernel; Refused when it is not this rule's form (`conv`: A read through a window)."""
    s_tir = require("tvm.s_tir")
    sch = s_tir.Schedule(func)
    block, before, after = only_reduction(sch)
    if str(sch.get(block).writes[0].source.dtype) != "float32":
        raise Refused("not fp32")
    inline_producers(sch, before)  # a padding block that is not a plain copy stays a loop nest of its own
    epilogue = single_epilogue(sch, after)
    r = roles(sch, block, func)
    if r.plain_a == conv:
        raise Refused("a convolution window" if not conv else "not a convolution window")
    n_extent = static_extent(r.extents[[i.name for i in r.iters].index(r.col.name)])
    if n_extent is None:
        raise Refused("symbolic N")
    if epilogue is None:
        epilogue = sch.cache_write(block, 0, "local")
    else:
        sch.set_scope(block, 0, "local")
    contiguous_out = r.out[-1].same_as(r.col)
    canonicalize(sch, block, epilogue, r)
    m_extent = static_extent(sch.get(sch.get_loops(block)[len(r.batch)]).extent)
    tile = gemm_tile(m_extent, n_extent, unit)
    if r.b_packable and n_extent > tile.width or not r.plain_a and r.b_packable:
        pack_weight(sch, block, r, tile.width)
    elif not r.b_packable and len(r.reduce) != 1:
        raise Refused("B cannot be packed")
    parallel = worth_threads(sch, block, r, tile)
    schedule_tile(sch, block, tile, epilogue, len(r.batch), len(r.reduce), contiguous_out, parallel)
    return sch


def worth_threads(sch: Any, block: Any, r: Roles, tile: Tile) -> bool:
    """Whether the tiles go to TVM's thread pool: enough multiply-adds, or enough weight to stream (a one-row
    product is bound by memory bandwidth, which a second core adds), and at least two tiles; the build then
    measures whether more than one thread pays (build.choose_threads)."""
    loops = sch.get_loops(block)
    extents = [static_extent(sch.get(loop).extent) for loop in loops]
    if any(e is None for e in extents):
        return False
    macs = 1
    for extent in extents:
        macs *= extent
    m, n = extents[len(r.batch)], extents[len(r.batch) + 1]
    tiles = -(-m // tile.rows) * -(-n // tile.width)
    for extent in extents[:len(r.batch)]:
        tiles *= extent
    weight_bytes = 4 * macs // max(1, m) if r.b_packable else 0
    return tiles >= 2 and (macs >= PARALLEL_MIN_MACS or weight_bytes >= PARALLEL_MIN_BYTES)
