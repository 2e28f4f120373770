"""One count of usable cores."""

from __future__ import annotations

import os

from rlopt.machine import usable_core_ids, usable_cores


def test_usable_cores_follow_the_affinity_not_the_machine() -> None:
    assert usable_cores() == len(usable_core_ids()) >= 1
    if hasattr(os, "sched_getaffinity"):
        assert usable_core_ids() == set(os.sched_getaffinity(0))
