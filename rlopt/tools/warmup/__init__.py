"""`rlopt warmup`: cold start, steady state and consistency under load of a compiled network.

`driver` runs it (load, first calls, load threads), `analysis` decides steady state and builds the report,
`profile` reads and checks warmup profiles, `report` writes the JSON and the plot, `schema` is the report.
Rendering (rich live display and tables) is the CLI's: `rlopt.render.warmup`.

The names below are imported on first use, not with this package: rlopt.recipe imports
`rlopt.tools.warmup.profile`, and that must not pull in the driver (which reaches rlopt.recipe again).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "STEADY_DEFINITION": "analysis", "WarmupResult": "analysis", "steady_index": "analysis",
    "run_warmup": "driver",
    "WarmupProfile": "profile", "check_against": "profile", "load_profile": "profile", "read_profile": "profile",
    "LiveShape": "schema", "LiveStatus": "schema", "Monitor": "schema", "WarmupReport": "schema",
}


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)


__all__ = ["STEADY_DEFINITION", "LiveShape", "LiveStatus", "Monitor", "WarmupProfile", "WarmupReport",
           "WarmupResult", "check_against", "load_profile", "read_profile", "run_warmup", "steady_index"]
