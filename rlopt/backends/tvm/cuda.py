"""Stage: TVM (Relax, 0.27) library for a CUDA target such as `{kind: cuda, arch: sm_86}` (A10G).

Cross-compiled on a machine without a GPU: the Relax build schedules every fused kernel for the
GPU (dlight's default GPU rules; an unscheduled PrimFunc cannot be lowered for CUDA) and
`export_library` writes the .so. What that .so holds was measured (shared notes): the host code
plus the kernels as CUDA SOURCE, which TVM compiles when the library is loaded (NVRTC, or nvcc with
TVM_CUDA_COMPILE_MODE=nvcc), so the deploying machine needs TVM and NVRTC or nvcc. To catch a
kernel that does not compile for the target arch here rather than there, the embedded source is
compiled with nvcc for that arch at build time and the result recorded. Without nvcc: skipped.

The library cannot run without a GPU; the pipeline then records it built but `verified: false`
with the reason. Helpers (ONNX shape-comparison rewrite, fused-kernel count, file naming) come
from rlopt.backends.tvm.build.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from rlopt.errors import BackendUnavailable, RecipeError, StageError, first_line, located
from rlopt.lazy import require
from rlopt.machine import gpu_identity
from rlopt.backends.tvm.config import TvmConfig
from rlopt.backends.tvm.facts import TvmFacts
from rlopt.spec import Precision
from rlopt.stages.base import StageOutput
from rlopt.backends.tvm.build import fused_kernels, target_slug, tensorize_shape_comparisons



def find_nvcc() -> str | None:
    """nvcc on PATH, else under CUDA_HOME / CUDA_PATH, else /usr/local/cuda/bin."""
    found = shutil.which("nvcc")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and (Path(root) / "bin" / "nvcc").is_file():
            return str(Path(root) / "bin" / "nvcc")
    return None


def nvcc_release(nvcc: str) -> str:
    """'13.0' from `nvcc --version`, or 'unknown'."""
    try:
        text = subprocess.run([nvcc, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    match = re.search(r"release (\d+\.\d+)", text)
    return match.group(1) if match else "unknown"


def _cuda_source(executable: Any) -> str:
    """The CUDA source module inside a built Relax executable (host module -> device module)."""
    pending = list(executable.mod.imports)
    while pending:
        module = pending.pop()
        if module.kind == "cuda":
            return str(module.inspect_source(""))
        pending.extend(module.imports)
    raise StageError("the TVM build holds no CUDA module (no kernel was offloaded to the GPU)")


def _precision_model(model: Any, precision: Precision) -> tuple[Any, str | None]:
    """fp16 casts written into the graph (as for TensorRT 11); other reduced precisions not applied, with a notice."""
    if precision == "fp16":
        from rlopt.onnx_graph import to_fp16

        return to_fp16(model), None
    if precision in ("bf16", "int8"):
        return model, (f"precision {precision} not applied: TVM for CUDA here is built in fp32 "
                       "(only fp16 casts are written)")
    return model, None


def build_tvm_cuda(onnx_path: Path, config: TvmConfig, out_dir: Path, *, precision: Precision, recipe_path: Path,
                   network: str) -> StageOutput:
    arch = config.target.get("arch")
    if not arch or not re.fullmatch(r"sm_\d+[a-z]?", str(arch)):
        raise RecipeError(located(recipe_path, "tvm.target.arch", f"a CUDA target needs arch like sm_86, got {arch!r}",
                                  "add arch: sm_86 (A10G) or your GPU's compute capability"))
    nvcc = find_nvcc()
    if nvcc is None:
        raise BackendUnavailable(f"TVM for CUDA {arch} needs nvcc to compile its kernels; nvcc is not on PATH, "
                                 "CUDA_HOME or /usr/local/cuda/bin (install the CUDA toolkit)")
    onnx = require("onnx")
    tvm = require("tvm")
    relax = require("tvm.relax")
    dl = require("tvm.s_tir.dlight")
    nvcc_support = require("tvm.support.nvcc")
    from_onnx = require("tvm.relax.frontend.onnx").from_onnx

    model = onnx.load(str(onnx_path))
    rewrites = tensorize_shape_comparisons(model)
    model, notice = _precision_model(model, precision)
    target_dict = dict(config.target)
    target_dict.setdefault("host", {"kind": "llvm"})
    try:
        target = tvm.target.Target(target_dict)
    except Exception as exc:  # tvm raises its own error types for a bad target dict: the recipe's, exit 2
        raise RecipeError(located(recipe_path, "tvm.target", f"TVM rejects {config.target} ({str(exc).splitlines()[0]})",
                                 "give a TVM JSON target dict such as {kind: cuda, arch: sm_86}")) from None
    try:
        mod = from_onnx(model, keep_params_in_input=False)
        mod = relax.transform.ConvertToDataflow(min_size=1)(mod)
        with target:
            mod = relax.get_pipeline("zero")(mod)
            mod = dl.ApplyDefaultSchedule(dl.gpu.Matmul(), dl.gpu.GEMV(), dl.gpu.Reduction(),
                                          dl.gpu.GeneralReduction(), dl.gpu.Fallback())(mod)
        kernels = fused_kernels(mod)
        executable = tvm.compile(mod, target)
        source = _cuda_source(executable)
    except (StageError, BackendUnavailable):
        raise
    except Exception as exc:  # the TVM frontend and compiler raise many error types
        first = str(exc).strip().splitlines()[-1] if str(exc).strip() else type(exc).__name__
        raise StageError(located(recipe_path, f"networks.{network}", f"TVM cannot compile the ONNX model for CUDA: "
                                 f"{first}", "drop tvm from backends or use a {kind: llvm} target")) from None
    env_path = os.environ.get("PATH", "")
    try:
        os.environ["PATH"] = f"{Path(nvcc).parent}{os.pathsep}{env_path}"
        with target:
            fatbin = bytes(nvcc_support.compile_cuda(source, target_format="fatbin", compiler="nvcc"))
    except Exception as exc:  # nvcc failures come back as RuntimeError with the compiler log
        first = first_line(exc)
        raise StageError(located(recipe_path, "tvm.target", f"nvcc could not compile TVM's kernels for {arch}: {first}",
                                 "check the arch against the installed CUDA toolkit")) from None
    finally:
        os.environ["PATH"] = env_path
    out_path = out_dir / f"tvm-{target_slug(config.target)}.so"
    executable.export_library(str(out_path))
    facts: dict[str, Any] = {
        "target": dict(config.target), "tuned": False, "fused_kernels": kernels,
        "shape_comparisons_tensorized": rewrites,
        "pipeline": "ConvertToDataflow + relax 'zero' pipeline + dlight default GPU schedules",
        "precision_built": "fp16" if precision == "fp16" else "fp32",
        "library_holds": "host code + CUDA kernel source; TVM compiles the kernels when the library is loaded "
                         "(NVRTC via cuda-bindings, or nvcc with TVM_CUDA_COMPILE_MODE=nvcc)",
        "cross_compile_check": {"nvcc": nvcc_release(nvcc), "arch": arch, "fatbin_bytes": len(fatbin),
                                "fatbin_sha256": hashlib.sha256(fatbin).hexdigest(),
                                "cuda_source_bytes": len(source)},
        "tvm": tvm.__version__,
        "gpu": gpu_identity(),  # None when built on a machine without a GPU (then verified: false)
    }
    if notice:
        facts["notice"] = notice
    return StageOutput(out_path, TvmFacts(**facts))
