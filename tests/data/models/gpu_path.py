"""Test model for the GPU path: hidden dims 1000 and 513 that GEMM padding rounds up to 1024 and 768.

The policy keeps the reference design's `if obs.size(0) > 1` branch (two ONNX subgraphs sharing
initializers) and uses GELU (decomposed into Div/Erf/Add/Mul/Mul at opset 17); the value network
has a LayerNorm between two layers, an edge that must NOT be padded.
"""

from __future__ import annotations

import torch
from torch import nn


class Policy(nn.Module):
    def __init__(self, obs: int = 64, hidden: int = 1000, width: int = 513, n_actions: int = 6) -> None:
        super().__init__()
        self.fc1 = nn.Linear(obs, hidden)
        self.fc2 = nn.Linear(hidden, width)
        self.head = nn.Linear(width, n_actions)
        self.act = nn.GELU()

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.size(0) > 1:
            return self.head(self.act(self.fc2(torch.relu(self.fc1(obs)))))
        single = obs[0]
        return self.head(self.act(self.fc2(torch.relu(self.fc1(single))))).unsqueeze(0)


class Value(nn.Module):
    def __init__(self, obs: int = 64, hidden: int = 1000, width: int = 513) -> None:
        super().__init__()
        self.fc1 = nn.Linear(obs, hidden)
        self.fc2 = nn.Linear(hidden, width)
        self.norm = nn.LayerNorm(width)
        self.out = nn.Linear(width, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.out(self.norm(self.fc2(torch.tanh(self.fc1(obs)))))


class GpuPathModel(nn.Module):
    def __init__(self, obs: int = 64, hidden: int = 1000, width: int = 513, n_actions: int = 6) -> None:
        super().__init__()
        self.policy = Policy(obs, hidden, width, n_actions)
        self.value = Value(obs, hidden, width)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(obs), self.value(obs)
