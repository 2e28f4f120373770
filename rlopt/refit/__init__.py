"""`rlopt refit`: new weights into a compiled MODEL_DIR without recompiling (contract section 10).

`rlopt.refit(model_dir, checkpoint, out=None)` is the public call. Importing this package makes the name
`rlopt.refit` the package itself, so the package is callable and calls `refit`, whichever one a caller reaches.
"""

from __future__ import annotations

import sys
import types
from typing import Any

from rlopt.refit.driver import RefitResult, refit, refit_model_dir


class _CallablePackage(types.ModuleType):
    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return refit(*args, **kwargs)


sys.modules[__name__].__class__ = _CallablePackage

__all__ = ["RefitResult", "refit", "refit_model_dir"]
