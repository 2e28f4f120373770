"""`rlopt.load` and `Session` (contract section 5). Reads only manifest.json; imports no compile code.

session.py: Session and its input check; routes.py: `auto` (which backend serves which shape);
loader.py: manifest -> checked artifacts -> runners -> Session.
"""

from __future__ import annotations

from rlopt.runtime.loader import KNOWN_BACKENDS, load, open_artifact, resolve_backend, usable_backends
from rlopt.runtime.routes import AutoPlan, ranked_backends, recorded_plan, unbucketed_p50, unbucketed_variant
from rlopt.runtime.session import Session, check_feeds

__all__ = ["KNOWN_BACKENDS", "AutoPlan", "Session", "check_feeds", "load", "open_artifact", "ranked_backends",
           "recorded_plan", "resolve_backend", "unbucketed_p50", "unbucketed_variant", "usable_backends"]
