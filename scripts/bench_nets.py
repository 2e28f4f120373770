"""Networks scripts/bench.py compiles untuned (no tuning database beside their recipe), for TVM's schedule rules:
MLP policies of common widths and the full-size NatureCNN (SB3 CnnPolicy on 84x84 Atari frames).

Each is written as a recipe into the bench's work dir with this file (and recipes/models/atari.py) copied beside
it as its model code.
"""

from __future__ import annotations

import torch
from torch import nn

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "silu": nn.SiLU}
MLP_OBS = (4, 17, 64, 376)
MLP_HIDDEN = (64, 256, 512)
MLP_STYLES = ("tanh", "relu", "silu-ln")  # SB3's Tanh MlpPolicy, a ReLU net, a SAC-style LayerNorm + SiLU actor
MLP_BATCHES = (1, 64, 256)
CNN_BATCHES = (1, 8, 16)


class Mlp(nn.Module):
    """obs -> hidden -> hidden -> actions, with an activation after each hidden layer (LayerNorm before it when
    `layer_norm`)."""

    def __init__(self, obs: int, hidden: int, act: str = "relu", layer_norm: bool = False, actions: int = 6) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = obs
        for _ in range(2):
            layers += [nn.Linear(width, hidden), *([nn.LayerNorm(hidden)] if layer_norm else []), ACTIVATIONS[act]()]
            width = hidden
        self.net = nn.Sequential(*layers, nn.Linear(hidden, actions))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


def mlp_grid() -> dict[str, tuple[int, int, str]]:
    """Bench name -> (obs, hidden, style): every obs x hidden pair, the styles taking turns so each appears alike."""
    grid = {}
    for i, obs in enumerate(MLP_OBS):
        for j, hidden in enumerate(MLP_HIDDEN):
            style = MLP_STYLES[(i + j) % len(MLP_STYLES)]
            grid[f"mlp-o{obs}-h{hidden}-{style}"] = (obs, hidden, style)
    return grid


def mlp_recipe(name: str) -> dict[str, object]:
    obs, hidden, style = mlp_grid()[name]
    act, layer_norm = (style.removesuffix("-ln"), style.endswith("-ln"))
    lo, mid, hi = MLP_BATCHES
    return {"name": name, "model": {"factory": "models/bench_nets.py:Mlp",
                                     "kwargs": {"obs": obs, "hidden": hidden, "act": act, "layer_norm": layer_norm}},
            "networks": {"actor": {"module": "", "kind": "policy", "outputs": ["logits"], "inputs": {
                "obs": {"dtype": "float32", "min": [lo, obs], "opt": [mid, obs], "max": [hi, obs]}}}},
            "verify": {"samples": 4}}


def nature_cnn_recipe(name: str) -> dict[str, object]:
    """The bundled atari-cnn model (NatureCNN actor-critic), compiled without the recipe's tuning database."""
    lo, mid, hi = CNN_BATCHES
    return {"name": name, "model": {"factory": "models/atari.py:AtariActorCritic", "kwargs": {"n_actions": 6}},
            "networks": {"actor_critic": {"module": "", "kind": "policy", "outputs": ["logits", "value"], "inputs": {
                "frames": {"dtype": "uint8", "min": [lo, 4, 84, 84], "opt": [mid, 4, 84, 84],
                           "max": [hi, 4, 84, 84]}}}},
            "verify": {"samples": 4}}


__all__ = ["CNN_BATCHES", "MLP_BATCHES", "Mlp", "mlp_grid", "mlp_recipe", "nature_cnn_recipe"]
