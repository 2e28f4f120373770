"""Relax pass: fp32 sigmoid as 0.5 + 0.5 * fast_tanh(x / 2), so SiLU and sigmoid layers vectorize.

TVM lowers `sigmoid` to 1 / (1 + exp(-x)) with LLVM's `exp`, which has no vector form here: every element is a
scalar libm call. Measured on a [64, 256] Linear + SiLU kernel, scheduled: 122 us with sigmoid, 56 us for the same
kernel with fast_tanh. Relax's FastMathTransform (run by the importer) already does this for tanh, exp and erf;
fast_tanh is a clamped rational polynomial (error ~3e-7 here), and the parity gate checks the result like any build.
"""

from __future__ import annotations

from typing import Any

from rlopt.lazy import require


def _fast_sigmoid(x: Any) -> Any:
    topi = require("tvm.topi")
    tvm = require("tvm")
    half = tvm.tirx.const(0.5, x.dtype)
    return topi.add(topi.multiply(topi.fast_tanh(topi.multiply(x, half)), half), half)


def fast_sigmoid(mod: Any) -> Any:
    """`mod` with every fp32 `relax.sigmoid` call replaced by the fast_tanh form."""
    relax = require("tvm.relax")
    @relax.expr_functor.mutator
    class Rewriter(relax.PyExprMutator):  # type: ignore[misc,name-defined]
        def visit_call_(self, call: Any) -> Any:
            call = super().visit_call_(call)
            op = getattr(call.op, "name", "")
            if op == "relax.sigmoid" and str(getattr(call.ty, "dtype", "")) == "float32":
                return self.builder_.call_te(_fast_sigmoid, call.args[0], primfunc_name_hint="fast_sigmoid")
            return call

    rewriter = Rewriter(mod)
    for gv, func in mod.functions_items():
        if isinstance(func, relax.Function):
            rewriter.builder_.update_func(gv, rewriter.visit_expr(func))
    return rewriter.builder_.get()
