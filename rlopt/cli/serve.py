"""`rlopt serve`: one MODEL_DIR over the KServe v2 protocol (HTTP and gRPC) with batching and metrics."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from rlopt.cli.base import app

SERVE_MODULES = ("uvicorn", "starlette", "grpc", "prometheus_client", "tritonclient.grpc")


def missing_serve_modules() -> list[str]:
    """The modules of the `serve` extra that cannot be imported here."""
    from importlib.util import find_spec

    missing = []
    for module in SERVE_MODULES:
        try:
            found = find_spec(module) is not None
        except (ImportError, ValueError):
            found = False
        if not found:
            missing.append(module)
    return missing


@app.command("serve")
def serve_command(
    model_dir: Annotated[Path, typer.Argument(help="A compiled MODEL_DIR; the only directory this server opens.")],
    http_port: Annotated[int, typer.Option("--http-port", help="HTTP/REST port (0: any free port).")] = 8000,
    grpc_port: Annotated[int, typer.Option("--grpc-port", help="gRPC port (0: any free port).")] = 8001,
    metrics_port: Annotated[int, typer.Option("--metrics-port", help="Prometheus /metrics port.")] = 8002,
    host: Annotated[str, typer.Option("--host", help="Address to bind (loopback unless you say otherwise).")
                    ] = "127.0.0.1",
    max_batch: Annotated[int, typer.Option("--max-batch", help="Most rows stacked into one run (1: no "
                                           "batching).")] = 8,
    max_wait_us: Annotated[float, typer.Option("--max-wait-us", help="Longest a request waits for others to "
                                               "batch with.")] = 500.0,
    network: Annotated[Optional[list[str]], typer.Option("--network", help="Serve only this network "
                                                         "(repeatable; default: all).")] = None,
    backend: Annotated[str, typer.Option("--backend", help="auto (the routes compile chose) or one backend.")
                       ] = "auto",
    watch: Annotated[bool, typer.Option("--watch", help="Reload through Session.reload when MODEL_DIR's manifest "
                                        "changes (rlopt refit).")] = False,
    sequence_idle_s: Annotated[float, typer.Option("--sequence-idle-s", help="Free a sequence's state after this "
                                                   "many idle seconds.")] = 600.0,
) -> None:
    """Serve MODEL_DIR's networks to many clients (Triton's protocol: tritonclient works unchanged) until SIGTERM."""
    import logging
    import math

    from rlopt.errors import UsageError

    missing = missing_serve_modules()
    if missing:
        raise UsageError(f"rlopt serve needs the 'serve' extra (missing: {', '.join(missing)}); fix: pip install "
                         "'rlopt[serve]'")
    for flag, port in (("--http-port", http_port), ("--grpc-port", grpc_port), ("--metrics-port", metrics_port)):
        if not 0 <= port <= 65535:
            raise UsageError(f"{flag} {port}: not a port; fix: give 0..65535 (0: any free port)")
    if max_batch < 1:
        raise UsageError(f"--max-batch {max_batch}: must be >= 1; fix: e.g. --max-batch 8 (1 turns batching off)")
    if not (math.isfinite(max_wait_us) and max_wait_us >= 0):
        raise UsageError(f"--max-wait-us {max_wait_us}: must be a finite number >= 0; fix: e.g. --max-wait-us 500")
    if not (math.isfinite(sequence_idle_s) and sequence_idle_s > 0):
        raise UsageError(f"--sequence-idle-s {sequence_idle_s}: must be > 0; fix: e.g. --sequence-idle-s 600")
    from rlopt.render import stderr
    from rlopt.serve.repository import ServeOptions
    from rlopt.serve.server import Listen, Server, serve

    logging.basicConfig(format="rlopt serve: %(message)s")
    logging.getLogger("rlopt.serve").setLevel(logging.INFO)
    options = ServeOptions(tuple(network or ()), backend, max_batch, max_wait_us, sequence_idle_s)

    def announce(server: Server) -> None:
        names = ", ".join(server.repository.networks) if server.repository else ""
        stderr.print(f"rlopt serve: {model_dir} ({names}) on http://{host}:{server.http_port}, grpc "
                     f"{host}:{server.grpc_port}, metrics http://{host}:{server.metrics_port}/metrics; max batch "
                     f"{max_batch}, max wait {max_wait_us:g} us{', watching the manifest' if watch else ''}",
                     markup=False, highlight=False, soft_wrap=True)

    serve(model_dir, options, Listen(host, http_port, grpc_port, metrics_port), watch=watch, on_ready=announce)
    stderr.print("rlopt serve: stopped; every accepted request was answered", markup=False, highlight=False)
