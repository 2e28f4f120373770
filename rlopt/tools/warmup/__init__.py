"""`rlopt warmup`: cold start, steady state and consistency under load of a compiled network.

`driver` runs it (load, first calls, load threads), `analysis` decides steady state and builds the report,
`report` writes the JSON and the plot, `schema` is the report; the profile format is `rlopt.warmup_profile`.
Rendering (rich live display and tables) is the CLI's: `rlopt.render.warmup`.
"""

from __future__ import annotations

from rlopt.tools.warmup.analysis import STEADY_DEFINITION, WarmupResult, steady_index
from rlopt.tools.warmup.driver import run_warmup
from rlopt.tools.warmup.schema import LiveShape, LiveStatus, Monitor, WarmupReport
from rlopt.warmup_profile import WarmupProfile, check_against, load_profile, read_profile

__all__ = ["STEADY_DEFINITION", "LiveShape", "LiveStatus", "Monitor", "WarmupProfile", "WarmupReport",
           "WarmupResult", "check_against", "load_profile", "read_profile", "run_warmup", "steady_index"]
