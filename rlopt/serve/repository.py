"""`Repository`: the networks one `rlopt serve` process serves from its one MODEL_DIR, and `--watch`'s reload.

Only the MODEL_DIR named on the command line is ever opened: no endpoint names a directory. `check_reload` (the
watch thread calls it) reloads every network through `Session.reload` when the manifest's `content_sha256`
changes, as `rlopt refit` publishes a new MODEL_DIR in place; the switch is logged and counted.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.errors import UsageError, located
from rlopt.manifest import MANIFEST_NAME, read_manifest
from rlopt.serve.batcher import Batcher
from rlopt.serve.errors import not_found
from rlopt.serve.metrics import ServeMetrics
from rlopt.serve.network import ServedNetwork
from rlopt.serve.padding import plan_for
from rlopt.serve.sequences import SequenceStore, state_pairs

log = logging.getLogger("rlopt.serve")

BODY_FLOOR = 1 << 20  # bytes a request body may always have (headers of JSON, small tensors)
BYTES_PER_ELEMENT = 32  # room per tensor element for its JSON text ("-1.2345678901234567e-05, ")


@dataclass(frozen=True)
class ServeOptions:
    """`rlopt serve`'s flags that shape the served networks (contract section 12)."""

    networks: tuple[str, ...] = ()
    backend: str = "auto"
    max_batch: int = 8
    max_wait_us: float = 500.0
    sequence_idle_s: float = 600.0


class Repository:
    """The served networks by name, their manifest's identity, and the request body limit they imply."""

    def __init__(self, model_dir: Path | str, options: ServeOptions, metrics: ServeMetrics | None = None) -> None:
        import rlopt

        self.model_dir, self.options, self.metrics = Path(model_dir), options, metrics
        manifest = read_manifest(self.model_dir)
        names = list(options.networks) or list(manifest.networks)
        for name in names:
            if name not in manifest.networks:
                raise UsageError(located(self.model_dir / MANIFEST_NAME, "networks", f"--network {name}: no such "
                                         "network", f"use one of: {', '.join(manifest.networks)}"))
        self.content_sha256 = manifest.content_sha256
        self._stamp = self._manifest_stamp()
        self.networks: dict[str, ServedNetwork] = {}
        try:
            for name in names:
                record = manifest.networks[name]
                # pools that sleep between calls: a spinning ONNX Runtime worker took up to a core from the event
                # loop and the batcher (the server's CPU per request fell by a third: docs/benchmarks.md, "Serving
                # on this host")
                session = rlopt.load(self.model_dir, name, options.backend, spinning=False)
                pairs = state_pairs(self.model_dir, record)
                store = SequenceStore(pairs, session.inputs, options.sequence_idle_s) if pairs else None
                observer = None
                if metrics is not None:
                    observer = metrics.batch_observer(name, lambda s=session: s.backend)
                batcher = Batcher(session, options.max_batch, options.max_wait_us, on_batch=observer)
                self.networks[name] = ServedNetwork(name, session, batcher, store, metrics)
                if metrics is not None:
                    metrics.watch(name, lambda b=batcher: b.queued, lambda s=store: len(s) if s else 0)
        except BaseException:
            self.close()
            raise
        largest = max(sum(int(np.prod(p.max)) for p in manifest.networks[n].inputs.values()) for n in names)
        self.body_limit = BODY_FLOOR + BYTES_PER_ELEMENT * largest
        if metrics is not None:
            metrics.loaded(self.content_sha256, {n: manifest.networks[n].drift for n in names})

    def get(self, name: str) -> ServedNetwork:
        network = self.networks.get(name)
        if network is None:
            raise not_found("model_name", f"no network '{name}' is served; fix: use one of "
                            f"{', '.join(self.networks)}")
        return network

    def _manifest_stamp(self) -> tuple[int, int, int] | None:
        try:
            stat = os.stat(self.model_dir / MANIFEST_NAME)
        except OSError:
            return None
        return (stat.st_ino, stat.st_mtime_ns, stat.st_size)

    def check_reload(self) -> bool:
        """Reload every network when MODEL_DIR's manifest changed; True when a reload happened. A failed reload
        is logged and counted, and the networks keep serving what they had."""
        stamp = self._manifest_stamp()
        if stamp is None or stamp == self._stamp:
            return False
        try:
            manifest = read_manifest(self.model_dir)
        except Exception as exc:  # noqa: BLE001 -- a manifest half-published or damaged: try again next time
            log.warning("MODEL_DIR %s changed but cannot be read yet: %s", self.model_dir, exc)
            return False
        self._stamp = stamp
        if manifest.content_sha256 == self.content_sha256:
            return False
        try:
            for network in self.networks.values():
                network.session.reload(self.model_dir)
                network.batcher.padding = plan_for(network.session)  # the new manifest's latencies
        except Exception as exc:  # noqa: BLE001 -- the old weights keep serving; the operator sees why
            log.error("reload of %s failed, still serving manifest %s: %s", self.model_dir, self.content_sha256[:12],
                      exc)
            if self.metrics is not None:
                self.metrics.reloads.labels("failed").inc()
            return False
        log.info("reloaded %s: manifest %s -> %s", self.model_dir, self.content_sha256[:12],
                    manifest.content_sha256[:12])
        self.content_sha256 = manifest.content_sha256
        if self.metrics is not None:
            self.metrics.reloads.labels("ok").inc()
            self.metrics.loaded(self.content_sha256, {n: manifest.networks[n].drift for n in self.networks})
        return True

    def expire_sequences(self) -> int:
        return sum(n.sequences.expire() for n in self.networks.values() if n.sequences is not None)

    def close(self) -> None:
        """Answer every queued request, then close every session."""
        for network in self.networks.values():
            network.close()

    def server_metadata(self) -> dict[str, Any]:
        from rlopt import __version__

        return {"name": "rlopt", "version": __version__, "extensions": ["binary_tensor_data", "sequence"]}


__all__ = ["BODY_FLOOR", "BYTES_PER_ELEMENT", "Repository", "ServeOptions"]
