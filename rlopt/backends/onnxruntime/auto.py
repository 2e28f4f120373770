"""ONNX Runtime in `auto`'s measurement: its intra-op threads, one thread or the default pool, chosen per shape.

The one place that decides ONNX Runtime's threads: compile times both configurations (`variants`), this module picks
one per shape label (`choose`) and says what the route opens the session with (`TunedRoute.options`: the session's
`intra_op_threads`, and `shape_threads` for the labels that run on the other configuration); the runtime opens
exactly what the route records.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

from rlopt.backends.capability import POOL_WORTH_US, Table, TunedRoute, clearly_faster
from rlopt.backends.onnxruntime.facts import SECOND_SESSION_MAX_BYTES, OnnxRuntimeFacts
from rlopt.facts import OTHER

ONE_THREAD = "1 thread"  # the configuration: one intra-op thread, no pool to spin or to wake
POOL = ""  # the artifact's own configuration: ONNX Runtime's default pool
NOISE = 0.05  # one configuration's worst shape must be this much worse to move a graph too large for two sessions


def _worst_ratio(slow: Mapping[str, float], fast: Mapping[str, float]) -> tuple[float, str]:
    """The largest slow / fast over the shapes both time (at least 1), and its shape."""
    ratios = {p: slow[p] / fast[p] for p in slow if p in fast and fast[p] > 0}
    worst = max(ratios, key=lambda p: ratios[p], default="")
    return max(1.0, ratios.get(worst, 1.0)), worst


class OnnxRuntimeThreads:
    """ONNX Runtime's `AutoTuning`."""

    def variants(self, facts: OnnxRuntimeFacts, cores: int) -> dict[str, dict[str, Any]]:
        """One intra-op thread, where the artifact runs a pool of more (several usable cores, no fixed count)."""
        return {ONE_THREAD: {"intra_op_threads": 1}} if cores > 1 and facts.intra_op_threads != 1 else {}

    def choose(self, alone: Table, together: Table | None, artifact_bytes: int,
               margins: Mapping[str, float] | None = None, cpu: Table | None = None,
               contended: bool = False) -> TunedRoute | None:
        """Per shape label, the configuration that is clearly faster (by `margins[label]`, at least NOISE); within
        the margin, the pool where one thread's call is long enough for a pool to gain (POOL_WORTH_US of CPU time per
        call, `cpu[ONE_THREAD]`, else its wall time), one thread below. A pool timed while other processes hold a
        core reads about one thread's speed, while on a quiet machine it was 1.37x / 1.58x faster at the default
        policy's opt and max (145 / 475 us on one thread): a busy build machine must not send those to one thread.
        Measured while other processes held a core (`contended`), a long call keeps the pool whatever the figures:
        the default value head's pool read 1.27x slower than one thread beside a busy core, 1.57x faster quiet.
        Below ~100 us (the 64- and 256-row MLPs) the pool's gain was within +-15% and changed sign within minutes,
        and one thread is the cheaper bet. The session's own configuration is the one at OTHER (the shapes without
        a point of their own), else the one most labels take (the pool on a tie), and the labels that differ get a
        session of their own: the bench judges every shape against the faster of the two, and one configuration per
        network would trade a shape's loss against another's gain. A graph too large to open twice keeps one
        configuration: the pool when one thread's worst shape is over NOISE and over NOISE worse than the pool's
        worst, else one thread."""
        if ONE_THREAD not in alone or POOL not in alone:
            return None
        one, pool = alone[ONE_THREAD], alone[POOL]
        labels = [label for label in one if label in pool and one[label] > 0 and pool[label] > 0]
        if not labels:
            return None
        work = (cpu or {}).get(ONE_THREAD, one)

        def pool_at(label: str) -> bool:
            margin = max(NOISE, (margins or {}).get(label, NOISE))
            if work.get(label, one[label]) >= POOL_WORTH_US:
                return contended or not clearly_faster(one[label], pool[label], margin)
            return clearly_faster(pool[label], one[label], margin)

        pooled = {label: pool_at(label) for label in labels}
        if artifact_bytes <= SECOND_SESSION_MAX_BYTES:
            default = pooled[OTHER] if OTHER in pooled else sum(pooled.values()) * 2 >= len(pooled)
        else:
            one_worst, pool_worst = _worst_ratio(one, pool)[0], _worst_ratio(pool, one)[0]
            default = one_worst > 1 + NOISE and one_worst > pool_worst * (1 + NOISE)
            pooled = dict.fromkeys(labels, default)
        def per_label(table: Table) -> dict[str, float]:
            return {label: table[POOL if pooled.get(label, default) else ONE_THREAD][label]
                    for label in table[POOL] if label in table[ONE_THREAD]}

        def options(routed: Collection[str]) -> dict[str, Any]:
            """The configuration of the shapes routed here (the session's default unless none of them takes it: a
            route that gives ONNX Runtime only its one-thread shapes opens no pool)."""
            served = [label for label in routed if label in pooled]
            base = default if not served or any(pooled[label] == default for label in served) else not default
            own = {label: 0 if pooled[label] else 1 for label in served if pooled[label] != base and label != OTHER}
            return {**({} if base else {"intra_op_threads": 1}), **({"shape_threads": own} if own else {})}

        both = together is not None and ONE_THREAD in together and POOL in together
        chosen = ", ".join(f"{label} {'pool' if pooled[label] else '1 thread'} "
                           f"{max(one[label], pool[label]) / min(one[label], pool[label]):.2f}x" for label in labels)
        return TunedRoute(per_label(alone), per_label(together) if both and together is not None else None, options,
                          f"onnxruntime threads per shape (the other configuration's latency over the chosen one): "
                          f"{chosen}", {label: POOL if pooled.get(label, default) else ONE_THREAD
                                        for label in pool if label in one})


THREADS = OnnxRuntimeThreads()


def upgrade_v1_facts(network: dict[str, Any]) -> dict[str, Any]:
    """A schema 1 manifest's ONNX Runtime keys of its network facts, as the route's options: `auto_onnxruntime_*`
    (spinning: recorded, else off wherever the route mixed backends), removed from `network`."""
    spinning = network.pop("auto_onnxruntime_spinning", None)
    threads = network.pop("auto_onnxruntime_threads", None)
    shape_threads = network.pop("auto_onnxruntime_shape_threads", None)
    routes = dict(network.get("auto_routes") or {})
    if spinning is None:
        spinning = len(set(routes.values())) == 1
    options: dict[str, Any] = {} if spinning else {"allow_spinning": False}
    if threads:
        options["intra_op_threads"] = threads
    if shape_threads:
        options["shape_threads"] = shape_threads
    return options


__all__ = ["ONE_THREAD", "POOL_WORTH_US", "THREADS", "OnnxRuntimeThreads", "upgrade_v1_facts"]
