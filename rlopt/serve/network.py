"""`ServedNetwork`: one network of MODEL_DIR as a model of the protocol: its metadata, its request check, its
batcher and, for a network with `state`, its live sequences.

Every refusal is an `InferError` naming the field (`inputs[0].shape: ...`). A request's Future ends in its
outputs (name -> array, in the order asked for) or in an `InferError` (`as_infer_error`).
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import numpy as np

from rlopt.serve.batcher import Batcher, BatcherClosed, RequestTimeout
from rlopt.serve.errors import InferError, invalid, not_found
from rlopt.serve.metrics import ServeMetrics
from rlopt.serve.protocol import InferRequest, datatype_of
from rlopt.serve.sequences import SequenceStore

VERSION = "1"


def as_infer_error(exc: BaseException) -> InferError:
    """What a failed request answers: its own InferError, a timeout, shutdown, a bad value, or an internal error."""
    if isinstance(exc, InferError):
        return exc
    if isinstance(exc, RequestTimeout):
        return InferError(f"parameters.timeout: {exc}", 408, "timeout")
    if isinstance(exc, BatcherClosed):
        return InferError(f"the server is shutting down: {exc}", 503, "unavailable")
    if isinstance(exc, ValueError):
        return InferError(f"inputs: {exc}", 400, "invalid")
    return InferError(f"internal error: {type(exc).__name__}: {exc}", 500, "internal")


class ServedNetwork:
    """A network's session behind its batcher; `outputs` holds each output's datatype and dims (-1 where dynamic)."""

    def __init__(self, name: str, session: Any, batcher: Batcher, sequences: SequenceStore | None,
                 metrics: ServeMetrics | None = None) -> None:
        self.name, self.session, self.batcher, self.sequences = name, session, batcher, sequences
        self.metrics = metrics
        self.outputs = output_signatures(session)
        self._datatypes = {n: datatype_of(p.dtype) for n, p in session.inputs.items()}

    def metadata(self) -> dict[str, Any]:
        """The protocol's model metadata: inputs and outputs with datatypes and dims, -1 where dynamic."""
        inputs = [{"name": n, "datatype": self._datatypes[n], "shape": [lo if lo == hi else -1 for lo, hi in
                                                                          zip(p.min, p.max)]}
                  for n, p in self.session.inputs.items()]
        outputs = [{"name": n, "datatype": dt, "shape": dims} for n, (dt, dims) in self.outputs.items()]
        return {"name": self.name, "versions": [VERSION], "platform": f"rlopt_{self.session.backend}",
                "inputs": inputs, "outputs": outputs}

    def check_version(self, version: str) -> None:
        if version not in ("", VERSION):
            raise not_found("model_version", f"network '{self.name}' has version {VERSION} only, not {version!r}")

    def submit(self, request: InferRequest) -> Future[list[tuple[str, np.ndarray]]]:
        """Check the request against the network and queue it; the Future holds the outputs asked for."""
        start = time.perf_counter()
        backend = self.session.backend
        if self.metrics is not None:
            self.metrics.requests.labels(self.name, backend).inc()
        try:
            feeds, wanted = self._check(request)
            store = self.sequences  # _check refused sequence parameters for a network without state
            if request.sequence_id is not None and store is not None:
                inner = store.step(request.sequence_id, request.sequence_start, request.sequence_end, feeds,
                                   lambda f: self.batcher.submit(f, request.priority, request.timeout_us))
            else:
                inner = self.batcher.submit(feeds, request.priority, request.timeout_us)
        except Exception as exc:  # noqa: BLE001 -- every refusal becomes the request's error, the server goes on
            error = as_infer_error(exc)
            self._count_failure(backend, error)
            raise error from None
        result: Future[list[tuple[str, np.ndarray]]] = Future()

        def done(finished: Future[dict[str, np.ndarray]]) -> None:
            exc = finished.exception()
            if exc is not None:
                error = as_infer_error(exc)
                self._count_failure(backend, error)
                result.set_exception(error)
                return
            outputs = finished.result()
            if self.metrics is not None:
                self.metrics.latency.labels(self.name).observe(time.perf_counter() - start)
            result.set_result([(name, outputs[name]) for name in wanted])

        inner.add_done_callback(done)
        return result

    def _count_failure(self, backend: str, error: InferError) -> None:
        if self.metrics is not None:
            self.metrics.failures.labels(self.name, backend, error.reason).inc()

    def _check(self, request: InferRequest) -> tuple[dict[str, np.ndarray], list[str]]:
        """The feeds by input name and the outputs to answer, after every protocol-level check."""
        self.check_version(request.version)
        profiles = self.session.inputs
        stateful = self.sequences is not None and bool(self.sequences.pairs)
        if request.sequence_id is not None and not stateful:
            raise invalid("parameters.sequence_id", f"network '{self.name}' has no recurrent state; fix: send it "
                          "without sequence parameters", "sequence")
        if request.sequence_id is None and (request.sequence_start or request.sequence_end):
            raise invalid("parameters.sequence_start", "sequence_start / sequence_end without a sequence_id", "sequence")
        feeds: dict[str, np.ndarray] = {}
        for index, tensor in enumerate(request.inputs):
            where = f"inputs[{index}]"
            profile = profiles.get(tensor.name)
            if profile is None:
                raise invalid(f"{where}.name", f"network '{self.name}' has no input '{tensor.name}'; fix: use its "
                              f"inputs: {', '.join(profiles)}", "input")
            if tensor.name in feeds:
                raise invalid(f"{where}.name", f"input '{tensor.name}' is given twice", "input")
            expected = self._datatypes[tensor.name]
            if tensor.datatype != expected:
                raise invalid(f"{where}.datatype", f"input '{tensor.name}' is {expected}, not {tensor.datatype}",
                              "datatype")
            if len(tensor.shape) != len(profile.min):
                raise invalid(f"{where}.shape", f"input '{tensor.name}' has rank {len(profile.min)} (between "
                              f"{profile.min} and {profile.max}), not {len(tensor.shape)} ({tensor.shape})", "shape")
            for axis, (dim, lo, hi) in enumerate(zip(tensor.shape, profile.min, profile.max)):
                if not lo <= dim <= hi:
                    raise invalid(f"{where}.shape", f"{tensor.shape} is outside the compiled profile of "
                                  f"'{tensor.name}': dim {axis} is {dim}, allowed [{lo}, {hi}]", "shape")
            feeds[tensor.name] = tensor.array
        omissible = set(self.sequences.pairs) if stateful and request.sequence_id is not None else set()
        missing = [n for n in profiles if n not in feeds and n not in omissible]
        if missing:
            raise invalid("inputs", f"no input '{missing[0]}'; fix: send every input of '{self.name}': "
                          f"{', '.join(profiles)}", "input")
        if request.outputs is None:
            return feeds, list(self.outputs)
        wanted = []
        for index, output in enumerate(request.outputs):
            if output.name not in self.outputs:
                raise invalid(f"outputs[{index}].name", f"network '{self.name}' has no output '{output.name}'; fix: "
                              f"ask for some of {', '.join(self.outputs)}", "output")
            wanted.append(output.name)
        return feeds, wanted

    def close(self) -> None:
        """Answer every queued request, then close the session."""
        self.batcher.close()
        self.session.close()


def output_signatures(session: Any) -> dict[str, tuple[str, list[int]]]:
    """Each output's datatype and dims, from one run at the min and one at the max shape (also a warm-up): a dim
    that differs between them is dynamic (-1)."""
    runs = []
    for point in ("min", "max"):
        feeds = {n: np.zeros(getattr(p, point), dtype=p.dtype) for n, p in session.inputs.items()}
        if any(p.index_range for p in session.inputs.values()):
            feeds = {n: np.full(v.shape, session.inputs[n].index_range[0], v.dtype)
                     if session.inputs[n].index_range else v for n, v in feeds.items()}
        runs.append(session.run(feeds))
    low, high = runs
    return {name: (datatype_of(low[name].dtype),
                   [a if a == b else -1 for a, b in zip(low[name].shape, high[name].shape)]
                   if low[name].ndim == high[name].ndim else [-1] * low[name].ndim)
            for name in session.outputs}


__all__ = ["VERSION", "ServedNetwork", "as_infer_error", "output_signatures"]
