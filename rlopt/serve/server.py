"""`rlopt serve`'s process: HTTP (uvicorn), gRPC (grpcio) and metrics (prometheus_client) over one Repository.

Lifecycle: load every network (warm-up included), bind the three ports, serve. SIGTERM or SIGINT (or `stop()`)
makes the server not ready and stops both transports from accepting; requests already accepted are answered
(uvicorn's graceful shutdown, gRPC's grace period, then every batcher's queue is run), and `serve` returns.
A housekeeping thread frees idle sequences and, with `watch`, reloads MODEL_DIR when its manifest changes.
"""

from __future__ import annotations

import logging
import socket
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rlopt.errors import UsageError
from rlopt.serve.repository import Repository, ServeOptions

log = logging.getLogger("rlopt.serve")

GRACE_S = 30.0  # how long accepted gRPC calls may take to finish after shutdown begins
GRPC_WORKERS = 64
BACKLOG = 2048
# The event loop decodes requests while the batcher's worker waits for the GIL to run the next batch: at Python's
# default 5 ms switch interval a woken worker waited ~4.5 ms per request under 16 clients; the server hands the GIL
# over sooner.
SWITCH_INTERVAL_S = 0.0002  # concurrent gRPC calls (each waits on its request's Future in its own thread)


@dataclass(frozen=True)
class Listen:
    """Where the server listens; port 0 takes any free port (the bound ports are on `Server`)."""

    host: str = "127.0.0.1"
    http_port: int = 8000
    grpc_port: int = 8001
    metrics_port: int = 8002


def _bind(host: str, port: int) -> socket.socket:
    family = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0][0]
    # proto IPPROTO_TCP, not 0: asyncio sets TCP_NODELAY on accepted sockets only then (else a response written in
    # two parts waits for the client's delayed ACK, 40 ms)
    sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(BACKLOG)  # connections queue from now on, before the event loop serves them
    except OSError:
        sock.close()
        raise
    return sock


class Server:
    """One MODEL_DIR on HTTP, gRPC and metrics ports; `start()`, then `serve()` (blocking) until stopped."""

    def __init__(self, model_dir: Path | str, options: ServeOptions, listen: Listen = Listen(), *,
                 watch: bool = False, housekeeping_s: float = 1.0) -> None:
        self.model_dir, self.options, self.listen, self.watch = Path(model_dir), options, listen, watch
        self.housekeeping_s = housekeeping_s
        self.repository: Repository | None = None
        self.http_port = self.grpc_port = self.metrics_port = 0
        self._ready = False
        self._stopping = threading.Event()
        self._grpc: Any = None
        self._grpc_stopped: Any = None
        self._metrics_server: Any = None
        self._uvicorn: Any = None
        self._socket: socket.socket | None = None

    def is_ready(self) -> bool:
        return self._ready and not self._stopping.is_set()

    def start(self) -> None:
        """Load the networks and bind every port; an error here leaves nothing running."""
        import uvicorn
        from prometheus_client import start_http_server

        from rlopt.serve.grpc_service import start_grpc
        from rlopt.serve.http_app import create_app
        from rlopt.serve.metrics import ServeMetrics

        metrics = ServeMetrics()
        self.repository = Repository(self.model_dir, self.options, metrics)
        what = "http"
        try:
            self._socket = _bind(self.listen.host, self.listen.http_port)
            self.http_port = self._socket.getsockname()[1]
            what = "grpc"
            self._grpc, self.grpc_port = start_grpc(self.repository, self.is_ready, self.listen.host,
                                                    self.listen.grpc_port, GRPC_WORKERS)
            what = "metrics"
            self._metrics_server, _ = start_http_server(self.listen.metrics_port, addr=self.listen.host,
                                                        registry=metrics.registry)
            self.metrics_port = self._metrics_server.server_port
        except (OSError, RuntimeError) as exc:
            self._release()
            port = getattr(self.listen, f"{what}_port")
            raise UsageError(f"cannot listen on {self.listen.host}:{port} for {what}: {exc}; fix: choose a free "
                             f"--{what}-port (0: any free port) or another --host") from None
        except BaseException:
            self._release()
            raise
        config = uvicorn.Config(create_app(self.repository, self.is_ready), log_level="warning", access_log=False,
                                lifespan="off", timeout_graceful_shutdown=GRACE_S)
        server = self

        class Uvicorn(uvicorn.Server):  # type: ignore[misc]
            def handle_exit(self, sig: int, frame: Any) -> None:
                server._begin_stop()
                super().handle_exit(sig, frame)

        self._uvicorn = Uvicorn(config)
        self._ready = True
        threading.Thread(target=self._housekeeping, name="rlopt-serve-housekeeping", daemon=True).start()

    def serve(self) -> None:
        """Serve HTTP on this thread until stopped (a signal on the main thread, or `stop()`), then drain."""
        if self._uvicorn is None or self._socket is None:
            raise RuntimeError("Server.serve before Server.start")
        try:
            self._uvicorn.run(sockets=[self._socket])
        finally:
            self._begin_stop()
            self._release()

    def stop(self) -> None:
        """Ask a serving server to shut down gracefully (thread-safe)."""
        self._begin_stop()
        if self._uvicorn is not None:
            self._uvicorn.should_exit = True

    def _begin_stop(self) -> None:
        if self._stopping.is_set():
            return
        self._stopping.set()
        log.warning("rlopt serve: shutting down; answering the requests already accepted")
        if self._grpc is not None:
            self._grpc_stopped = self._grpc.stop(GRACE_S)

    def _release(self) -> None:
        """After HTTP has drained: wait for gRPC's accepted calls, run every queue, close sessions and ports."""
        self._stopping.set()
        if self._grpc is not None:
            (self._grpc_stopped or self._grpc.stop(GRACE_S)).wait()
        if self.repository is not None:
            self.repository.close()
        if self._metrics_server is not None:
            self._metrics_server.shutdown()
            self._metrics_server.server_close()
        if self._socket is not None:
            self._socket.close()

    def _housekeeping(self) -> None:
        while not self._stopping.wait(self.housekeeping_s):
            repository = self.repository
            if repository is None:
                continue
            try:
                repository.expire_sequences()
                if self.watch:
                    repository.check_reload()
            except Exception:  # noqa: BLE001 -- housekeeping must not die; the log says what happened
                log.exception("rlopt serve: housekeeping failed")


def serve(model_dir: Path | str, options: ServeOptions, listen: Listen, *, watch: bool = False,
          on_ready: Any = None) -> None:
    """Start, report the bound ports through `on_ready(server)`, serve until SIGTERM / SIGINT, drain."""
    import signal
    import sys

    sys.setswitchinterval(SWITCH_INTERVAL_S)
    server = Server(model_dir, options, listen, watch=watch,
                    housekeeping_s=min(1.0, max(0.05, options.sequence_idle_s / 4)))
    server.start()
    if threading.current_thread() is threading.main_thread():
        # before uvicorn takes the signals over, and after it raises a caught one again once drained
        for sig in (signal.SIGTERM, signal.SIGINT):
            signal.signal(sig, lambda *_: server.stop())
    if on_ready is not None:
        on_ready(server)
    server.serve()


__all__ = ["GRACE_S", "Listen", "Server", "serve"]
