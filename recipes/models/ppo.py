"""Continuous-control PPO actor-critic (64x64 tanh), as in Stable-Baselines3's MlpPolicy."""

from __future__ import annotations

import torch
from torch import nn


class GaussianActor(nn.Module):
    def __init__(self, obs_dim: int, act_dim: int, width: int = 64) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(obs_dim, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh())
        self.mean = nn.Linear(width, act_dim)
        self.log_std = nn.Parameter(torch.full((act_dim,), -0.5))

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        mean = self.mean(self.body(obs))
        return mean, self.log_std.expand_as(mean)


class Critic(nn.Module):
    def __init__(self, obs_dim: int, width: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(obs_dim, width), nn.Tanh(), nn.Linear(width, width), nn.Tanh(),
                                 nn.Linear(width, 1))

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.net(obs)


class ActorCritic(nn.Module):
    def __init__(self, obs_dim: int = 17, act_dim: int = 6, width: int = 64) -> None:
        super().__init__()
        self.actor = GaussianActor(obs_dim, act_dim, width)
        self.critic = Critic(obs_dim, width)
