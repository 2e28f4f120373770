"""Fixtures of the serving tests: small MODEL_DIRs (ONNX Runtime only, compiled once per session) and a server
started in this process on free loopback ports, one per test module."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from rlopt.serve.repository import ServeOptions
from rlopt.serve.server import Listen, Server
from tests.conftest import CompileFactory, tiny_recipe_text

GRU_MODEL = """\
import torch
from torch import nn


class GruActor(nn.Module):
    def __init__(self, obs: int = 6, hidden: int = 16, n_actions: int = 3) -> None:
        super().__init__()
        self.cell = nn.GRUCell(obs, hidden)
        self.head = nn.Linear(hidden, n_actions)

    def forward(self, obs: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h_new = self.cell(obs, h)
        return self.head(h_new), h_new
"""

GRU_RECIPE = """\
name: gru-actor
model: {factory: models/gru_actor.py:GruActor, seed: 2}
networks:
  actor:
    module: ""
    kind: policy
    inputs:
      obs: {dtype: float32, min: [1, 6], opt: [4, 6], max: [8, 6]}
      h: {dtype: float32, min: [1, 16], opt: [4, 16], max: [8, 16]}
    outputs: [logits, h_new]
    state: {h: h_new}
backends: [onnxruntime]
verify: {samples: 2, steps: 2}
"""


@pytest.fixture(scope="session")
def ort_tiny(compiled: CompileFactory) -> Path:
    """The tiny recipe (policy and value networks) for ONNX Runtime only; tests must not modify it."""
    return compiled(tiny_recipe_text("[onnxruntime]"), name="tiny.yaml")


@pytest.fixture(scope="session")
def gru_dir(compiled: CompileFactory) -> Path:
    """A recurrent GRU actor (state h -> h_new) for ONNX Runtime."""
    return compiled(GRU_RECIPE, name="gru.yaml", files={"models/gru_actor.py": GRU_MODEL})


@contextmanager
def running(model_dir: Path, options: ServeOptions = ServeOptions(), *, watch: bool = False,
            housekeeping_s: float = 1.0) -> Iterator[Server]:
    """A server on free loopback ports, serving on a thread; stopped (and drained) on exit."""
    server = Server(model_dir, options, Listen("127.0.0.1", 0, 0, 0), watch=watch, housekeeping_s=housekeeping_s)
    server.start()
    thread = threading.Thread(target=server.serve, name="test-serve", daemon=True)
    thread.start()
    try:
        yield server
    finally:
        server.stop()
        thread.join(30)
        assert not thread.is_alive(), "the server did not stop"


@pytest.fixture(scope="module")
def tiny_server(ort_tiny: Path) -> Iterator[Server]:
    with running(ort_tiny) as server:
        yield server
