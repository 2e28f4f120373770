"""`rlopt serve` and `rlopt.Batcher` (contract section 12): many actors served from one compiled network.

A layer over the runtime (`rlopt.load`, `Session`, `Session.reload`), never over compile code:
`batcher` (stacking along dim 0, priorities, timeouts; `padding` decides when a named shape is faster),
`sequences` (server-side recurrent state), `protocol` / `http_codec` / `grpc_service` (KServe v2 as Triton
speaks it), `network` (one network as a model: metadata, request checks), `repository` (the served MODEL_DIR,
`--watch`'s reload), `http_app` (Starlette), `metrics` (prometheus_client), `server` (lifecycle, SIGTERM).

Names are imported on first use: importing rlopt must not import numpy-heavy or transport code.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {"Batcher": "batcher", "BatchStats": "batcher", "BatcherClosed": "batcher", "RequestTimeout": "batcher",
            "Listen": "server", "Server": "server", "serve": "server", "ServeOptions": "repository"}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


__all__ = sorted(_EXPORTS)
