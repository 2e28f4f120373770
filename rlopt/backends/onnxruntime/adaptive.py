"""ONNX Runtime's intra-op threads chosen while serving: `auto` opens the artifact twice (one thread and the default
pool), and each calling thread times both at each signature now and then, serving from the faster.

Which of the two is faster is a property of the machine at the time, not of the model: on a shared 2-core VM it
flipped within minutes (sb3-ppo-cartpole's value net at 256x4, the pool at 0.87x one thread in a compile's worker,
then 1.25x two minutes later in processes of their own), so a choice fixed at compile time is right only while the
machine stays as compile found it.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

PROBE_CALLS = 16  # timed calls per session in one look
WARM_NS = 5_000_000  # untimed calls first on the session not serving: a pool woken from sleep ran its first 50-100
# calls at 1.2-1.4x its steady latency (sb3-ppo-cartpole's value net at 256x4: 66-76 us, then 55 us), which a look
# of 8 calls after one untimed call took for the pool's speed and kept one thread
LOOK_SHARE = 50  # the calls until the next look take at least this many times as long as the look did
FIRST_INTERVAL = 256  # calls until the next look after a switch; doubled after each look that keeps the session
MAX_INTERVAL = 1 << 20
MARGIN = 0.05  # the other session must be this much faster to take over (timing noise)
MAX_EVENTS = 100

NativeRun = Callable[[list[str], dict[str, Any], Any], list[Any]]


class ThreadChoice:
    """One calling thread's choice at one signature: the session that serves (`run`) and the calls until the next
    look (`left`). The bound call copies both into its own closure, counts down there, calls `look` below zero and
    copies them again; `left` starts at zero, so the first call looks."""

    __slots__ = ("left", "run", "current", "interval", "_runs", "_label", "_report", "_clock")

    def __init__(self, runs: dict[str, NativeRun], current: str, label: str,
                 report: Callable[[dict[str, Any]], None], clock: Callable[[], int] = time.perf_counter_ns) -> None:
        self._runs, self._label, self._report, self._clock = runs, label, report, clock
        self.current, self.run = current, runs[current]
        self.left, self.interval = 0, FIRST_INTERVAL

    def _median_ns(self, run: NativeRun, fetched: list[str], feeds: dict[str, Any],
                   warm_ns: int) -> tuple[float, list[Any]]:
        """Median of PROBE_CALLS timed calls, after untimed ones for `warm_ns` (at least one)."""
        start = self._clock()
        out = run(fetched, feeds, None)
        while self._clock() - start < warm_ns:
            out = run(fetched, feeds, None)
        samples = []
        for _ in range(PROBE_CALLS):
            begin = self._clock()
            out = run(fetched, feeds, None)
            samples.append(self._clock() - begin)
        return statistics.median(samples), out

    def look(self, fetched: list[str], feeds: dict[str, Any]) -> list[Any]:
        """Time the serving session, then the other after warming it; switch when the other is over MARGIN faster.
        The next look comes after `interval` calls (doubled when the serving session stays) and no sooner than
        LOOK_SHARE times this look's length. Returns the outputs of the last call on the session that serves."""
        began = self._clock()
        timed = {name: self._median_ns(self._runs[name], fetched, feeds, 0 if name == self.current else WARM_NS)
                 for name in sorted(self._runs, key=lambda n: n != self.current)}
        best = min(timed, key=lambda name: timed[name][0])
        if best != self.current and timed[best][0] < timed[self.current][0] * (1 - MARGIN):
            self._report({"event": f"onnxruntime switched to {best}", "from": self.current, "shape": self._label,
                          **{f"{name}_us": round(ns / 1e3, 2) for name, (ns, _) in timed.items()},
                          "thread": threading.current_thread().name})
            self.current, self.run, self.interval = best, self._runs[best], FIRST_INTERVAL
        else:
            self.interval = min(MAX_INTERVAL, self.interval * 2)
        spent = self._clock() - began
        self.left = max(self.interval, int(LOOK_SHARE * spent / max(timed[self.current][0], 1.0)))
        return timed[self.current][1]


class SwitchLog:
    """The switches of every ThreadChoice of one runner, oldest first, at most MAX_EVENTS kept."""

    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        self._lock = threading.Lock()  # taken only on a switch, never on a call

    def report(self, event: dict[str, Any]) -> None:
        with self._lock:
            if len(self.events) < MAX_EVENTS:
                self.events.append(event)


__all__ = ["FIRST_INTERVAL", "LOOK_SHARE", "MARGIN", "MAX_INTERVAL", "PROBE_CALLS", "WARM_NS", "SwitchLog",
           "ThreadChoice"]
