"""LLM policy and value heads over hidden states [batch, seq, hidden] (the reference design's networks)."""

from __future__ import annotations

import torch
from torch import nn


class PolicyHead(nn.Module):
    """MLP policy head. Keeps the reference design's branch: a batch path and a single-observation path.

    Both paths compute the same maths; the single path drops the batch dim (as serving code for one
    request does) and restores it. A correct export must keep both.
    """

    def __init__(self, hidden: int = 768, width: int = 256, n_actions: int = 16) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, width)
        self.fc2 = nn.Linear(width, width)
        self.logits = nn.Linear(width, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        if obs.size(0) > 1:
            x = torch.relu(self.fc1(obs))
            x = torch.relu(self.fc2(x))
            return self.logits(x)
        single = obs[0]
        x = torch.relu(self.fc1(single))
        x = torch.relu(self.fc2(x))
        return self.logits(x).unsqueeze(0)


class ValueHead(nn.Module):
    """MLP value head: one scalar per position."""

    def __init__(self, hidden: int = 768, width: int = 256) -> None:
        super().__init__()
        self.fc1 = nn.Linear(hidden, width)
        self.fc2 = nn.Linear(width, width)
        self.value = nn.Linear(width, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = torch.tanh(self.fc1(obs))
        x = torch.tanh(self.fc2(x))
        return self.value(x)


class PolicyValueHeads(nn.Module):
    """The two networks the reference design compiles separately."""

    def __init__(self, hidden: int = 768, width: int = 256, n_actions: int = 16) -> None:
        super().__init__()
        self.policy = PolicyHead(hidden, width, n_actions)
        self.value = ValueHead(hidden, width)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.policy(obs), self.value(obs)
