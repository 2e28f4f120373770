"""Every network of the bundled recipes, served: tritonclient's HTTP and gRPC clients get outputs that match
`rlopt.load`'s (contract section 7's "matches", the network's own tolerances) at its min, opt and max shapes.
Compiles every bundled recipe: slow."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import rlopt
from rlopt.manifest import read_manifest
from rlopt.parity import ParityAccumulator, Tolerance
from rlopt.reference import random_input
from rlopt.serve.protocol import datatype_of
from tests.conftest import RECIPES, CompileFactory
from tests.serve.conftest import running

httpclient = pytest.importorskip("tritonclient.http")
grpcclient = pytest.importorskip("tritonclient.grpc")

pytestmark = pytest.mark.slow


def served(module: object, client: object, network: str, feeds: dict[str, np.ndarray], outputs: list[str]
           ) -> list[np.ndarray]:
    tensors = []
    for name, value in feeds.items():
        tensor = module.InferInput(name, list(value.shape), datatype_of(value.dtype))  # type: ignore[attr-defined]
        tensor.set_data_from_numpy(value)
        tensors.append(tensor)
    result = client.infer(network, tensors)  # type: ignore[attr-defined]
    return [result.as_numpy(name) for name in outputs]


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_served_outputs_match_rlopt_load(compiled: CompileFactory, recipe: str) -> None:
    model_dir: Path = compiled(RECIPES / recipe)
    manifest = read_manifest(model_dir)
    rng = np.random.default_rng(11)
    with running(model_dir) as server:
        clients = [(httpclient, httpclient.InferenceServerClient(f"127.0.0.1:{server.http_port}")),
                   (grpcclient, grpcclient.InferenceServerClient(f"127.0.0.1:{server.grpc_port}"))]
        for network, record in manifest.networks.items():
            tolerance = Tolerance(record.tolerance["atol"], record.tolerance["rtol"],
                                  record.tolerance.get("max_kl", float("inf")))
            with rlopt.load(model_dir, network) as session:
                for module, client in clients:
                    check = ParityAccumulator(record.kind, record.distribution, record.outputs, tolerance)
                    for point in ("min", "opt", "max"):
                        feeds = {name: random_input(rng, profile, getattr(profile, point), name=name,
                                                    default_range=tuple(profile.index_range)
                                                    if profile.index_range else None)
                                 for name, profile in record.inputs.items()}
                        expected = list(session.run(feeds).values())
                        check.add(expected, served(module, client, network, feeds, record.outputs))
                    result = check.result()
                    assert result.passed and result.compared == 3, (recipe, network, module.__name__, result)
