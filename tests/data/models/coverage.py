"""The coverage matrix: small policy architectures RL users deploy, written after public designs.

Each class is a whole network (recipe `module: ""`); `ARCHITECTURES` gives the recipe fields that go with
it (kind, inputs, outputs, state). Hidden sizes stay <= 64 so that every compile takes seconds.
`RandomNet` builds a network from a list of layer names, for the property test.

Designs followed (public code, re-written small):
- Stable-Baselines3 `MlpPolicy` (ActorCriticPolicy: separate pi/vf MLPs, Tanh), `NatureCNN` (CnnPolicy,
  uint8 images scaled by 1/255), `CombinedExtractor` (MultiInputPolicy: one extractor per key, concatenated).
- sb3-contrib `RecurrentPPO` (an LSTM between extractor and heads, state in and out, [batch, layers, hidden])
  and `MaskablePPO` (logits of illegal actions set to -inf by a bool mask).
- CleanRL `ppo_procgen.py` IMPALA `ConvSequence` (conv, max-pool, two residual blocks).
- Decision Transformer (an encoder over [batch, K, d] for a fixed context K, the action from the last token).
- SAC's squashed Gaussian actor (deterministic action tanh(mean)).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

B = {"min": 1, "opt": 4, "max": 8}  # batch range of every architecture


def batched(*dims: int, dtype: str = "float32", **extra: Any) -> dict[str, Any]:
    """An input spec with a dynamic batch dim in front of `dims`."""
    return {"dtype": dtype, **{p: [b, *dims] for p, b in B.items()}, **extra}


def mlp(sizes: list[int], act: type[nn.Module] = nn.Tanh) -> nn.Sequential:
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(zip(sizes, sizes[1:])):
        layers.append(nn.Linear(a, b))
        if i < len(sizes) - 2:
            layers.append(act())
    return nn.Sequential(*layers)


class MlpActorCritic(nn.Module):
    """SB3 MlpPolicy for a Discrete action space: pi and vf MLPs [64, 64] with Tanh, then the heads."""

    def __init__(self, obs: int = 8, n_actions: int = 4, hidden: int = 64) -> None:
        super().__init__()
        self.pi = mlp([obs, hidden, hidden], nn.Tanh)
        self.vf = mlp([obs, hidden, hidden], nn.Tanh)
        self.action_net = nn.Linear(hidden, n_actions)
        self.value_net = nn.Linear(hidden, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.action_net(torch.tanh(self.pi(obs))), self.value_net(torch.tanh(self.vf(obs)))


class NatureCnn(nn.Module):
    """SB3 CnnPolicy's NatureCNN on uint8 CHW frames (channels shrunk): /255, 3 convs, a linear layer, a head."""

    def __init__(self, channels: int = 4, size: int = 36, n_actions: int = 6, features: int = 64) -> None:
        super().__init__()
        self.cnn = nn.Sequential(
            nn.Conv2d(channels, 16, 8, stride=4), nn.ReLU(),
            nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=1), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.cnn(torch.zeros(1, channels, size, size)).shape[1]
        self.linear = nn.Sequential(nn.Linear(flat, features), nn.ReLU())
        self.action_net = nn.Linear(features, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.action_net(self.linear(self.cnn(obs.float() / 255.0)))


class MultiInput(nn.Module):
    """SB3 MultiInputPolicy (CombinedExtractor): a small CNN for the image key, flatten for the vector key."""

    def __init__(self, vec: int = 6, size: int = 12, n_actions: int = 4) -> None:
        super().__init__()
        self.image = nn.Sequential(nn.Conv2d(1, 8, 3, stride=2), nn.ReLU(), nn.Flatten())
        with torch.no_grad():
            flat = self.image(torch.zeros(1, 1, size, size)).shape[1]
        self.pi = mlp([flat + vec, 64, 64], nn.Tanh)
        self.action_net = nn.Linear(64, n_actions)

    def forward(self, image: torch.Tensor, vector: torch.Tensor) -> torch.Tensor:
        features = torch.cat([self.image(image.float() / 255.0), vector], dim=1)
        return self.action_net(torch.tanh(self.pi(features)))


class RecurrentLstmActor(nn.Module):
    """sb3-contrib RecurrentPPO's actor: MLP extractor, one LSTM step, action head; state [batch, layers, hidden]."""

    def __init__(self, obs: int = 8, hidden: int = 32, n_actions: int = 4) -> None:
        super().__init__()
        self.extractor = nn.Sequential(nn.Linear(obs, hidden), nn.Tanh())
        self.lstm = nn.LSTM(hidden, hidden)
        self.action_net = nn.Linear(hidden, n_actions)

    def forward(self, obs: torch.Tensor, state_h: torch.Tensor,
                state_c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        features = self.extractor(obs).unsqueeze(0)  # [seq 1, batch, hidden]
        hx = (state_h.transpose(0, 1).contiguous(), state_c.transpose(0, 1).contiguous())
        out, (h, c) = self.lstm(features, hx)
        return self.action_net(out[0]), h.transpose(0, 1), c.transpose(0, 1)


class ResidualBlock(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(F.relu(self.conv0(F.relu(x))))


class ImpalaCnn(nn.Module):
    """CleanRL's IMPALA ConvSequence (conv, max-pool, two residual blocks) on uint8 frames, then the heads."""

    def __init__(self, channels: int = 3, size: int = 16, width: int = 8, n_actions: int = 5) -> None:
        super().__init__()
        self.conv = nn.Conv2d(channels, width, 3, padding=1)
        self.pool = nn.MaxPool2d(3, stride=2, padding=1)
        self.res0, self.res1 = ResidualBlock(width), ResidualBlock(width)
        out = (size + 1) // 2
        self.hidden = nn.Linear(width * out * out, 64)
        self.actor = nn.Linear(64, n_actions)
        self.critic = nn.Linear(64, 1)

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.res1(self.res0(self.pool(self.conv(obs.float() / 255.0))))
        x = F.relu(self.hidden(F.relu(torch.flatten(x, 1))))
        return self.actor(x), self.critic(x)


class AttentionPolicy(nn.Module):
    """Decision-Transformer style: embed each step, add a learned position, nn.TransformerEncoder over
    [batch, seq, d], the action logits from the last token."""

    def __init__(self, obs: int = 8, d: int = 32, heads: int = 2, layers: int = 1, max_seq: int = 8,
                 n_actions: int = 4) -> None:
        super().__init__()
        self.embed = nn.Linear(obs, d)
        self.position = nn.Parameter(torch.randn(1, max_seq, d) * 0.02)
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=64, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, n_actions)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = self.embed(obs) + self.position[:, : obs.shape[1]]
        return self.head(self.encoder(x)[:, -1])


class DynamicLengthAttention(nn.Module):
    """An nn.TransformerEncoder over tokens [batch, seq, d] whose seq varies per call (an LLM head, a
    multi-agent policy over a variable number of entities): the action logits from the last token."""

    def __init__(self, d: int = 128, heads: int = 4, layers: int = 2, n_actions: int = 6) -> None:
        super().__init__()
        layer = nn.TransformerEncoderLayer(d, heads, dim_feedforward=2 * d, dropout=0.0, batch_first=True)
        self.enc = nn.TransformerEncoder(layer, layers, enable_nested_tensor=False)
        self.head = nn.Linear(d, n_actions)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(tokens)[:, -1])


class LengthBoundAttention(DynamicLengthAttention):
    """Not compilable with a dynamic seq: the scripted encoder is refused by the TorchScript exporter, the
    branch on the length forbids the trace, and torch.export keeps only the branch its example takes (windows
    longer than 8 are averaged, shorter ones read from the last token, halved). Refused in one line naming the dim."""

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        encoded = self.enc(tokens)
        if tokens.size(1) > 8:
            return self.head(encoded.mean(dim=1))
        return self.head(encoded[:, -1]) * 0.5


class MaskedPolicy(nn.Module):
    """sb3-contrib MaskablePPO: the logits of illegal actions become -inf (a bool mask, True = legal)."""

    def __init__(self, obs: int = 8, n_actions: int = 6) -> None:
        super().__init__()
        self.pi = mlp([obs, 64, 64], nn.Tanh)
        self.action_net = nn.Linear(64, n_actions)

    def forward(self, obs: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
        logits = self.action_net(torch.tanh(self.pi(obs)))
        return logits.masked_fill(~action_mask, float("-inf"))


class SquashedGaussianActor(nn.Module):
    """SAC's actor: mean and clamped log_std; the deterministic action is tanh(mean), scaled to the bounds."""

    def __init__(self, obs: int = 8, act: int = 2, hidden: int = 64, scale: float = 2.0) -> None:
        super().__init__()
        self.latent = mlp([obs, hidden, hidden], nn.ReLU)
        self.mu = nn.Linear(hidden, act)
        self.log_std = nn.Linear(hidden, act)
        self.scale = scale

    def forward(self, obs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        latent = F.relu(self.latent(obs))
        return torch.tanh(self.mu(latent)) * self.scale, torch.clamp(self.log_std(latent), -20.0, 2.0)


class GruCellActor(nn.Module):
    """A GRUCell policy with state in and out (h [batch, hidden])."""

    def __init__(self, obs: int = 8, hidden: int = 32, n_actions: int = 4) -> None:
        super().__init__()
        self.cell = nn.GRUCell(obs, hidden)
        self.head = nn.Linear(hidden, n_actions)

    def forward(self, obs: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        h_new = self.cell(obs, h)
        return self.head(h_new), h_new


class GruCellWithBatchBranch(GruCellActor):
    """The scripted GRUCell is refused by the TorchScript exporter, and the branch on the batch size forbids the
    trace fallback (a trace would freeze it): the dynamo exporter's graph serves it (both branches agree)."""

    def forward(self, obs: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if obs.size(0) > 1:
            h_new = self.cell(obs, h)
        else:
            h_new = self.cell(obs, h) * 1.0
        return self.head(h_new), h_new


class LstmSequence(nn.Module):
    """nn.LSTM over a [batch, seq, obs] window (batch_first), a head per step, state in and out."""

    def __init__(self, obs: int = 8, hidden: int = 32, out: int = 4) -> None:
        super().__init__()
        self.lstm = nn.LSTM(obs, hidden, batch_first=True)
        self.head = nn.Linear(hidden, out)

    def forward(self, obs: torch.Tensor, h: torch.Tensor,
                c: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        y, (h_new, c_new) = self.lstm(obs, (h.transpose(0, 1).contiguous(), c.transpose(0, 1).contiguous()))
        return self.head(y), h_new.transpose(0, 1), c_new.transpose(0, 1)


class GruSequenceEncoder(nn.Module):
    """A GRU over a fixed window of the last K observations [batch, K, obs] (batch_first), the action logits
    from its last hidden state: a history encoder for partially observed tasks."""

    def __init__(self, obs: int = 8, hidden: int = 64, n_actions: int = 4, layers: int = 1) -> None:
        super().__init__()
        self.gru = nn.GRU(obs, hidden, num_layers=layers, batch_first=True)
        self.head = nn.Linear(hidden, n_actions)

    def forward(self, window: torch.Tensor) -> torch.Tensor:
        _, h = self.gru(window)
        return self.head(h[-1])


class EmbeddingPolicy(nn.Module):
    """Discrete tokens (int64 ids) through nn.Embedding, mean-pooled, an MLP head."""

    def __init__(self, vocab: int = 50, d: int = 16, n_actions: int = 4) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d)
        self.head = mlp([d, 32, n_actions], nn.ReLU)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(ids).mean(dim=1))


class LayerNormGeluHead(nn.Module):
    """A value head: Linear, LayerNorm, GELU, Linear."""

    def __init__(self, obs: int = 32, hidden: int = 64) -> None:
        super().__init__()
        self.fc = nn.Linear(obs, hidden)
        self.norm = nn.LayerNorm(hidden)
        self.out = nn.Linear(hidden, 1)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.out(F.gelu(self.norm(self.fc(obs))))


class Float64QNetwork(nn.Module):
    """A DQN Q-network fed float64 observations as the environment emits them, cast inside the graph."""

    def __init__(self, obs: int = 8, n_actions: int = 3) -> None:
        super().__init__()
        self.q = mlp([obs, 64, 64, n_actions], nn.ReLU)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return self.q(obs.float())


LAYERS = ("linear", "relu", "tanh", "gelu", "layernorm", "elu", "sigmoid", "softplus", "log")


class Log(nn.Module):
    """log(x): NaN for negative inputs, so a random network can fail parity with a NaN in PyTorch's output."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.log(x)


class RandomNet(nn.Module):
    """A network from layer names (property test): each name in LAYERS, widths `width`; `embedding` reads
    int64 ids [batch, seq] first (mean-pooled)."""

    def __init__(self, layers: list[str], obs: int = 8, width: int = 16, n_out: int = 4,
                 embedding: bool = False) -> None:
        super().__init__()
        self.use_embedding = embedding
        self.embed = nn.Embedding(20, obs) if embedding else nn.Identity()
        modules: list[nn.Module] = []
        size = obs
        for name in layers:
            if name == "linear":
                modules.append(nn.Linear(size, width))
                size = width
            elif name == "layernorm":
                modules.append(nn.LayerNorm(size))
            else:
                modules.append({"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU, "elu": nn.ELU,
                                "sigmoid": nn.Sigmoid, "softplus": nn.Softplus, "log": Log}[name]())
        modules.append(nn.Linear(size, n_out))
        self.body = nn.Sequential(*modules)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.embed(x).mean(dim=1) if self.use_embedding else x
        return self.body(features)


class RandomMaskedNet(RandomNet):
    """RandomNet with a bool action mask applied as MaskablePPO does."""

    def forward(self, x: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:  # type: ignore[override]
        features = self.embed(x).mean(dim=1) if self.use_embedding else x
        return self.body(features).masked_fill(~action_mask, float("-inf"))


class RandomGruNet(RandomNet):
    """RandomNet, then a GRUCell with state in and out (h [batch, hidden])."""

    def __init__(self, layers: list[str], obs: int = 8, width: int = 16, n_out: int = 4, hidden: int = 16) -> None:
        super().__init__(layers, obs, width, n_out)
        self.cell = nn.GRUCell(n_out, hidden)
        self.out = nn.Linear(hidden, n_out)

    def forward(self, x: torch.Tensor, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # type: ignore[override]
        h_new = self.cell(self.body(x), h)
        return self.out(h_new), h_new


class RandomConvNet(RandomNet):
    """A strided conv on uint8 [batch, 1, 9, 9] frames (/255), projected to `obs`, then RandomNet's layers."""

    def __init__(self, layers: list[str], obs: int = 8, width: int = 16, n_out: int = 4) -> None:
        super().__init__(layers, obs, width, n_out)
        self.conv = nn.Conv2d(1, 4, 3, stride=2)
        self.project = nn.Linear(4 * 4 * 4, obs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        features = self.project(torch.flatten(F.relu(self.conv(x.float() / 255.0)), 1))
        return self.body(features)


# name -> (class, kwargs, network fields). Every network is the whole model (module "").
ARCHITECTURES: dict[str, tuple[str, dict[str, Any], dict[str, Any]]] = {
    "sb3_mlp_actor_critic": ("MlpActorCritic", {}, {
        "kind": "policy", "inputs": {"obs": batched(8)}, "outputs": ["logits", "value"]}),
    "sb3_nature_cnn_uint8": ("NatureCnn", {}, {
        "kind": "policy", "inputs": {"obs": batched(4, 36, 36, dtype="uint8")}, "outputs": ["logits"]}),
    "sb3_multi_input": ("MultiInput", {}, {
        "kind": "policy", "inputs": {"image": batched(1, 12, 12, dtype="uint8"), "vector": batched(6)},
        "outputs": ["logits"]}),
    "recurrent_ppo_lstm": ("RecurrentLstmActor", {}, {
        "kind": "policy", "inputs": {"obs": batched(8), "state_h": batched(1, 32), "state_c": batched(1, 32)},
        "outputs": ["logits", "next_state_h", "next_state_c"],
        "state": {"state_h": "next_state_h", "state_c": "next_state_c"}}),
    "cleanrl_impala_resnet": ("ImpalaCnn", {}, {
        "kind": "policy", "inputs": {"obs": batched(3, 16, 16, dtype="uint8")}, "outputs": ["logits", "value"]}),
    # a fixed context window, as Decision Transformer pads to K: the trace fallback (the scripted encoder's
    # aten::is_autocast_enabled is refused) keeps the batch dynamic but would freeze a dynamic seq dim
    "decision_transformer": ("AttentionPolicy", {}, {
        "kind": "policy", "inputs": {"obs": batched(8, 8)}, "outputs": ["logits"]}),
    # a dynamic window of 1..64 tokens: the scripted encoder is refused, the trace freezes the length in its
    # Reshapes (the shape probe catches it), the dynamo export keeps it
    "attention_dynamic_length": ("DynamicLengthAttention", {}, {
        "kind": "policy", "inputs": {"tokens": {"dtype": "float32", "min": [1, 1, 128], "opt": [4, 20, 128],
                                                "max": [8, 64, 128]}}, "outputs": ["logits"]}),
    "maskable_ppo": ("MaskedPolicy", {}, {
        "kind": "policy", "inputs": {"obs": batched(8), "action_mask": batched(6, dtype="bool")},
        "outputs": ["logits"]}),
    "sac_squashed_gaussian": ("SquashedGaussianActor", {}, {
        "kind": "generic", "inputs": {"obs": batched(8)}, "outputs": ["action", "log_std"]}),
    "gru_cell_state": ("GruCellActor", {}, {
        "kind": "policy", "inputs": {"obs": batched(8), "h": batched(32)}, "outputs": ["logits", "h_new"],
        "state": {"h": "h_new"}}),
    "lstm_sequence_state": ("LstmSequence", {}, {
        "kind": "generic", "inputs": {"obs": {"dtype": "float32", "min": [1, 1, 8], "opt": [4, 3, 8],
                                              "max": [8, 6, 8]},
                                      "h": batched(1, 32), "c": batched(1, 32)},
        "outputs": ["out", "h_new", "c_new"], "state": {"h": "h_new", "c": "c_new"}}),
    "gru_sequence_encoder": ("GruSequenceEncoder", {}, {
        "kind": "policy", "inputs": {"window": batched(16, 8)}, "outputs": ["logits"]}),
    "embedding_ids": ("EmbeddingPolicy", {}, {
        "kind": "policy", "inputs": {"ids": {"dtype": "int64", "min": [1, 1], "opt": [4, 5], "max": [8, 8]}},
        "outputs": ["logits"]}),
    "layernorm_gelu_value": ("LayerNormGeluHead", {}, {
        "kind": "value", "inputs": {"obs": batched(32)}, "outputs": ["value"]}),
    "dqn_float64_obs": ("Float64QNetwork", {}, {
        "kind": "policy", "inputs": {"obs": batched(8, dtype="float64")}, "outputs": ["q_values"]}),
}


# verify.steps where the default (3) is not enough: an actor that feeds its state back is checked over 6 calls
STEPS = {"recurrent_ppo_lstm": 6}


def recipe_for(name: str, backends: list[str], *, samples: int = 4, steps: int | None = None,
               factory_path: str = "models/coverage.py") -> dict[str, Any]:
    """A recipe (as a mapping, for YAML) compiling architecture `name` as the network `net`."""
    cls, kwargs, network = ARCHITECTURES[name]
    steps = steps if steps is not None else STEPS.get(name, 3)
    return {
        "name": name.replace("_", "-"),
        "model": {"factory": f"{factory_path}:{cls}", "kwargs": kwargs, "seed": 0},
        "networks": {"net": {"module": "", **network}},
        "backends": backends,
        "verify": {"samples": samples, "steps": steps},
    }
