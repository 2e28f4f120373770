"""One way to open an ONNX Runtime session: the options rlopt sets, exactly the providers asked for, typed errors.

ONNX Runtime is both a backend and the front end's ONNX executor (GEMM padding's exactness check, bench's
baseline), so this lives below both. Every place that opens a session goes through `make_session`, so a setting
is decided once.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from rlopt.errors import ArtifactError, BackendUnavailable, RloptError, first_line, located
from rlopt.lazy import require

LIBRARY = "onnxruntime"  # the module (onnxruntime or onnxruntime-gpu installs it)
CPU_PROVIDER = "CPUExecutionProvider"
Optimization = Literal["disable", "basic", "extended", "all"]
_LEVELS = {"disable": "ORT_DISABLE_ALL", "basic": "ORT_ENABLE_BASIC", "extended": "ORT_ENABLE_EXTENDED",
           "all": "ORT_ENABLE_ALL"}


def make_session(path_or_bytes: Path | str | bytes, *, threads: int | None = None, spinning: bool | None = None,
                 optimization: Optimization | None = "all", providers: list[str] | None = None,
                 inter_op_threads: int = 1, provider_options: dict[str, dict[str, str]] | None = None,
                 cannot_load: tuple[type[RloptError], str] = (ArtifactError, "recompile MODEL_DIR")) -> Any:
    """An `onnxruntime.InferenceSession` on `path_or_bytes` (a file or the serialized model).

    threads: intra-op threads (None: ONNX Runtime's default, one per physical core); spinning: False stops the
    intra-op pool from spinning between calls (None: ONNX Runtime's default, spinning); a one-thread session has
    no pool, and the setting alone cost it 0.5-0.8 us a call on an 8 us MLP, so it is left out there; optimization:
    the graph optimization level (None: ONNX Runtime's default); providers: exactly these, in order (default CPU
    only); inter_op_threads: 1 by default, as the sequential executor uses no inter-op pool (unset: ~0.4 us more
    a call on the same MLP); provider_options: per provider name, its options (the CUDA provider's use_tf32).
    Raises `cannot_load` (the error and its fix; default: a MODEL_DIR's artifact, ArtifactError) when ONNX Runtime
    cannot load the model, and BackendUnavailable when the session lacks a requested provider (ONNX Runtime would
    silently fall back to the CPU).
    """
    ort = require(LIBRARY)
    wanted = list(providers or [CPU_PROVIDER])
    options = ort.SessionOptions()
    options.log_severity_level = 3
    if optimization is not None:
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _LEVELS[optimization])
    if threads:
        options.intra_op_num_threads = int(threads)
    options.inter_op_num_threads = int(inter_op_threads)
    if spinning is False and threads != 1:
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
    model = path_or_bytes if isinstance(path_or_bytes, bytes) else str(path_or_bytes)
    try:
        session = ort.InferenceSession(model, sess_options=options, providers=with_options(wanted, provider_options))
    except Exception as exc:  # onnxruntime raises its own untyped errors for a model it cannot load: `cannot_load`
        where = "ONNX model (bytes)" if isinstance(path_or_bytes, bytes) else path_or_bytes
        error, fix = cannot_load
        raise error(located(where, "", f"ONNX Runtime cannot load it ({first_line(exc)})", fix)) from None
    missing = [p for p in wanted if p not in session.get_providers()]
    if missing:
        raise BackendUnavailable(
            f"ONNX Runtime provider(s) {missing} requested but the session has only {session.get_providers()}; "
            f"fix: install onnxruntime-gpu on a GPU machine or request {CPU_PROVIDER}"
        )
    return session


def with_options(providers: list[str], options: dict[str, dict[str, str]] | None) -> list[Any]:
    """ONNX Runtime's provider list: a (name, options) pair where options are given, else the name."""
    return [(name, dict(options[name])) if options and name in options else name for name in providers]


__all__ = ["CPU_PROVIDER", "LIBRARY", "make_session", "with_options"]
