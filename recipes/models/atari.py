"""NatureCNN actor-critic over stacked Atari frames [B, 4, 84, 84] uint8 (Mnih et al. 2015)."""

from __future__ import annotations

import torch
from torch import nn


class NatureCNN(nn.Module):
    def __init__(self, frames: int = 4, features: int = 512) -> None:
        super().__init__()
        self.conv = nn.Sequential(
            nn.Conv2d(frames, 32, 8, stride=4), nn.ReLU(),
            nn.Conv2d(32, 64, 4, stride=2), nn.ReLU(),
            nn.Conv2d(64, 64, 3, stride=1), nn.ReLU(),
            nn.Flatten(),
        )
        self.fc = nn.Sequential(nn.Linear(64 * 7 * 7, features), nn.ReLU())

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.fc(self.conv(frames.float() / 255.0))


class AtariActorCritic(nn.Module):
    """Shared NatureCNN trunk with policy logits and a value, served as one network."""

    def __init__(self, n_actions: int = 6, frames: int = 4) -> None:
        super().__init__()
        self.trunk = NatureCNN(frames)
        self.pi = nn.Linear(512, n_actions)
        self.v = nn.Linear(512, 1)

    def forward(self, frames: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        features = self.trunk(frames)
        return self.pi(features), self.v(features)
