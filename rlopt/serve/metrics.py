"""Prometheus metrics of `rlopt serve` (prometheus_client, a registry per server), names starting `rlopt_`."""

from __future__ import annotations

import threading
from typing import Any, Callable

from rlopt.serve.batcher import BatchStats

LATENCY_BUCKETS = (25e-6, 50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3, 25e-3, 50e-3, 100e-3, 250e-3,
                   0.5, 1.0, 2.5)
BATCH_BUCKETS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256)


class ServeMetrics:
    """Every metric the server exports; `registry` is what the metrics endpoint serves."""

    def __init__(self) -> None:
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        self.registry = registry = CollectorRegistry()
        self.requests = Counter("rlopt_requests", "Inference requests received", ["network", "backend"],
                                registry=registry)
        self.failures = Counter("rlopt_request_failures", "Inference requests answered with an error",
                                ["network", "backend", "reason"], registry=registry)
        self.queue = Histogram("rlopt_queue_seconds", "Time a request waited in the batcher's queue", ["network"],
                               buckets=LATENCY_BUCKETS, registry=registry)
        self.compute = Histogram("rlopt_compute_seconds", "Time of one batched Session.run", ["network", "backend"],
                                 buckets=LATENCY_BUCKETS, registry=registry)
        self.latency = Histogram("rlopt_request_seconds", "End-to-end time of a request in the server, from its "
                                 "check to its answer", ["network"], buckets=LATENCY_BUCKETS, registry=registry)
        self.batch_rows = Histogram("rlopt_batch_size", "Rows stacked into one Session.run (before padding)",
                                    ["network"], buckets=BATCH_BUCKETS, registry=registry)
        self.padded = Counter("rlopt_padded_rows", "Zero rows added to reach a named shape", ["network"],
                              registry=registry)
        self.queue_depth = Gauge("rlopt_queue_depth", "Requests waiting in the batcher", ["network"],
                                 registry=registry)
        self.sequences = Gauge("rlopt_live_sequences", "Sequences with server-side state", ["network"],
                               registry=registry)
        self.manifest = Gauge("rlopt_manifest_info", "The loaded MODEL_DIR's manifest (1 for the live one)",
                              ["content_sha256"], registry=registry)
        self.reloads = Counter("rlopt_reloads", "Reloads of MODEL_DIR by --watch", ["result"], registry=registry)
        self.drift = Gauge("rlopt_reload_drift_kl", "Policy drift of the last reload (the manifest's KL(old || new))",
                           ["network", "statistic"], registry=registry)
        self._lock = threading.Lock()
        self._sha = ""

    def watch(self, network: str, queued: Callable[[], int], live: Callable[[], int]) -> None:
        self.queue_depth.labels(network).set_function(queued)
        self.sequences.labels(network).set_function(live)

    def batch_observer(self, network: str, backend: Callable[[], str]) -> Callable[[BatchStats], None]:
        queue, compute, rows, padded = (self.queue.labels(network), self.compute, self.batch_rows.labels(network),
                                        self.padded.labels(network))

        def observe(stats: BatchStats) -> None:
            for seconds in stats.queue_s:
                queue.observe(seconds)
            compute.labels(network, backend()).observe(stats.compute_s)
            rows.observe(stats.rows)
            if stats.padded_rows > stats.rows:
                padded.inc(stats.padded_rows - stats.rows)

        return observe

    def loaded(self, content_sha256: str, drift: dict[str, Any]) -> None:
        """The manifest now served; `drift`: network -> its Drift record (or None) from that manifest."""
        with self._lock:
            if self._sha and self._sha != content_sha256:
                self.manifest.remove(self._sha)
            self._sha = content_sha256
            self.manifest.labels(content_sha256).set(1)
        for network, record in drift.items():
            if record is not None:
                self.drift.labels(network, "mean").set(record.kl_mean)
                self.drift.labels(network, "max").set(record.kl_max)


__all__ = ["ServeMetrics"]
