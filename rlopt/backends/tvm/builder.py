"""The build function MetaSchedule's LocalBuilder runs in its worker processes during tuning.

Why a module of its own: the stock builder imports `tvm.s_tir.tensor_intrin` in every worker
(about 40 s here) and then hits its own 30 s timeout batch after batch (shared notes). A
builder function must be importable by name in a fresh worker, so it lives in a small module
that imports nothing but TVM, and only when called.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any


def build_candidate(mod: Any, target: Any, params: Any = None) -> Any:
    """Compile one scheduled candidate PrimFunc module to a runtime Module (not a relax Executable)."""
    import tvm
    from tvm.s_tir.transform import RemoveWeightLayoutRewriteBlock

    mod = RemoveWeightLayoutRewriteBlock(skip_tensor_rewrite=True)(mod)
    return tvm.tirx.build(mod, target=target)


def export_candidate(mod: Any, directory: str) -> str:
    """Export one built candidate under `directory` (the tune's scratch folder, removed when tuning ends): the
    stock export makes a `tempfile.mkdtemp()` folder per candidate that nothing ever removes."""
    import tempfile

    from tvm.support.tar import tar

    artifact = Path(tempfile.mkdtemp(dir=directory)) / f"tvm_tmp_mod.{tar.output_format}"
    mod.export_library(str(artifact), fcompile=tar)
    return str(artifact)
