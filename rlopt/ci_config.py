"""The recipe's `ci:` section (contract section 15): what `rlopt diff` counts as a regression.

Kept beside the recipe, not inside it: no stage reads it (changing a threshold rebuilds nothing), and
`rlopt diff` reads it back from NEW_DIR's resolved recipe.yaml without loading the rest of that recipe.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class CiConfig(BaseModel):
    """Thresholds of `rlopt diff OLD_DIR NEW_DIR`; its flags override each one."""

    model_config = ConfigDict(extra="forbid")

    # new / old latency of the selected (`auto`) route per named shape; a slowdown must also exceed the A/A noise
    max_latency_ratio: float = Field(default=1.10, ge=1.0)
    # mean KL(old || new) of a policy network on the reference inputs; None: drift is reported, not a failure
    max_drift_kl: float | None = Field(default=None, ge=0)
    # False: a backend built in OLD_DIR and not in NEW_DIR is a regression
    allow_dropped_backends: bool = False


__all__ = ["CiConfig"]
