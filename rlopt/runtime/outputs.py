"""What every runner and the reference recorder do with a model's return value (defined with the runners)."""

from __future__ import annotations

from rlopt.backends.base import flatten_outputs

__all__ = ["flatten_outputs"]
