"""Runner for `model.xml` (+ `model.bin`): the IR compiled for the CPU once, an infer request per calling thread.

A compiled model is shared by threads; an infer request is not (it holds the call's tensors), so `infer` takes the
calling thread's own request, and each bound call (one thread, one signature) has a request of its own with its
input tensors allocated once. The weights are read into memory (no mmap): the loader's private copy of the files
may be removed once the runner is open.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from rlopt.backends.base import BoundCall, Runner
from rlopt.backends.openvino.facts import OpenVinoFacts
from rlopt.backends.openvino.library import compile_config, import_openvino, shared_core
from rlopt.errors import ArtifactError, first_line, located

# A bound call copies an input this small into its request's own tensor (a copy of 64 KB costs about what wrapping
# the caller's array as an OpenVINO tensor and setting it does); a larger input is shared, not copied.
COPY_MAX_BYTES = 64 << 10


class OpenVinoRunner(Runner):
    def __init__(self, path: Path, input_names: list[str], facts: OpenVinoFacts | Mapping[str, Any]) -> None:
        facts = OpenVinoFacts.of(facts)
        self._ov = import_openvino()
        core = shared_core()
        self.input_names = input_names
        path = Path(path)
        try:
            model = core.read_model(str(path), str(path.with_suffix(".bin")), config={"ENABLE_MMAP": False})
            self._compiled = core.compile_model(model, facts.device, compile_config(facts))
        except RuntimeError as exc:
            raise ArtifactError(located(path, "", f"OpenVINO cannot load it ({first_line(exc)})",
                                        "recompile MODEL_DIR")) from None
        ports = {name: index for index, port in enumerate(self._compiled.inputs) for name in port.get_names()}
        unknown = [name for name in input_names if name not in ports]
        if unknown or len(self._compiled.inputs) != len(input_names):
            raise ArtifactError(located(path, "", f"the IR's inputs {sorted(ports)} are not the network's "
                                        f"{input_names}", "recompile MODEL_DIR"))
        self._indices = [ports[name] for name in input_names]
        self._outputs = len(self._compiled.outputs)
        self._local = threading.local()

    def _request(self) -> Any:
        request = getattr(self._local, "request", None)
        if request is None:
            request = self._local.request = self._compiled.create_infer_request()
        return request

    def infer(self, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        request, tensor = self._request(), self._ov.Tensor
        for name, index in zip(self.input_names, self._indices):
            array = np.ascontiguousarray(feeds[name])
            request.set_input_tensor(index, tensor(array, shared_memory=array.flags.writeable))
        request.infer()
        return [request.get_output_tensor(index).data.copy() for index in range(self._outputs)]

    def bound_call(self, signature: tuple[Any, ...], output_names: list[str]) -> BoundCall | None:
        """A request of its own for this thread and signature: small inputs are copied into tensors it allocated
        once, larger ones shared; the outputs are copied out (the request reuses their memory on the next call)."""
        if len(output_names) != self._outputs:
            return None
        ov, request = self._ov, self._compiled.create_infer_request()
        copied: list[tuple[int, np.ndarray]] = []
        shared: list[tuple[int, int]] = []
        for position, ((shape, dtype), index) in enumerate(zip(signature, self._indices)):
            if np.dtype(dtype).itemsize * int(np.prod(shape)) <= COPY_MAX_BYTES:
                owned = ov.Tensor(np.zeros(shape, dtype))
                request.set_input_tensor(index, owned)
                copied.append((position, owned.data))
            else:
                shared.append((position, index))
        outputs = list(enumerate(output_names))
        output, tensor, set_input, infer = request.get_output_tensor, ov.Tensor, request.set_input_tensor, request.infer

        def call(feeds: dict[str, np.ndarray], arrays: Any) -> dict[str, np.ndarray]:
            for position, view in copied:
                np.copyto(view, arrays[position])
            for position, index in shared:
                array = arrays[position]
                set_input(index, tensor(array, shared_memory=array.flags.writeable))  # OpenVINO shares no read-only array
            infer()
            return {name: output(index).data.copy() for index, name in outputs}

        return call

    def close(self) -> None:
        self._compiled = None
        self._local = threading.local()


__all__ = ["COPY_MAX_BYTES", "OpenVinoRunner"]
