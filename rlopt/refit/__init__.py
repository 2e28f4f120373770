"""`rlopt refit`: new weights into a compiled MODEL_DIR without recompiling (contract section 10)."""

from __future__ import annotations

from rlopt.refit.driver import RefitResult, refit, refit_model_dir

__all__ = ["RefitResult", "refit", "refit_model_dir"]
