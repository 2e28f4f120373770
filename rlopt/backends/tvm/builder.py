"""The build function MetaSchedule's LocalBuilder runs in its worker processes during tuning.

Why a module of its own: the stock builder imports `tvm.s_tir.tensor_intrin` in every worker
(about 40 s here) and then hits its own 30 s timeout batch after batch (shared notes). A
builder function must be importable by name in a fresh worker, so it lives in a small module
that imports nothing but TVM, and only when called.
"""

from __future__ import annotations

from typing import Any


def build_candidate(mod: Any, target: Any, params: Any = None) -> Any:
    """Compile one scheduled candidate PrimFunc module to a runtime Module (not a relax Executable)."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target)
