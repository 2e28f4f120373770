"""The weights a TVM library takes as parameters: the params file (an .npz keyed by ONNX initializer) and binding.

Libraries are built with the weights as arguments, not baked constants, so new weights need a new params file
and no LLVM build. Each library holds two functions lifted out of `main`: PREPARE (what baked weights would
have had folded: reshapes, ...) and TRANSFORM (the tuned kernels' weight pre-packing). They run once per library
when a runner opens, and `main` then takes the inputs followed by their outputs. Runtime code: no compile-side imports.
"""

from __future__ import annotations

import io
import os
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends.base import flatten_outputs

PREPARE, TRANSFORM = "main_prepare_params", "main_transform_params"  # run in this order
# a fixed member date, so the same weights always give the same bytes (and sha256)
_EPOCH = (1980, 1, 1, 0, 0, 0)


def write_params(path: Path, weights: dict[str, np.ndarray]) -> None:
    """An uncompressed .npz (np.load reads it), written beside `path` and renamed over it: never half-written."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED) as archive:
            for name, array in weights.items():
                buffer = io.BytesIO()
                np.lib.format.write_array(buffer, np.asarray(array), allow_pickle=False)
                archive.writestr(zipfile.ZipInfo(f"{name}.npy", date_time=_EPOCH), buffer.getvalue())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def read_params(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as archive:
        return {name: archive[name] for name in archive.files}


def bind_params(tvm: Any, vm: Any, names: list[str], weights: dict[str, np.ndarray], device: Any) -> list[Any]:
    """Run the library's weight transforms once on `names` (its parameter order); what `main` takes after the
    inputs."""
    raw = [tvm.runtime.tensor(weights[name], device=device) for name in names]
    return flatten_outputs(vm[TRANSFORM](flatten_outputs(vm[PREPARE](raw))))


__all__ = ["PREPARE", "TRANSFORM", "bind_params", "read_params", "write_params"]
