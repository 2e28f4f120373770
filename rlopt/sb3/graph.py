"""The agent's networks as scriptable nn.Modules: raw observation in, `predict(deterministic=True)`'s action out.

Every piece takes and returns plain tensors (no dicts or lists across modules, branches fixed at build time), so
`torch.jit.script` and the TorchScript ONNX exporter take the whole graph and emit only plain ONNX ops (no Sequence
ops). Each network's positional forward is generated for its inputs (`network`). This module imports without
torch (tests/test_dependencies.py); its classes need torch when they are built.
"""

from __future__ import annotations

import linecache
import math
from typing import Any, List, Tuple

import numpy as np

try:
    import torch
    from torch import Tensor, nn
except ImportError:  # the classes below are usable only with torch; this module still imports without it
    import types

    torch = None  # type: ignore[assignment]
    nn = types.SimpleNamespace(Module=object)  # type: ignore[assignment]
    Tensor = object  # type: ignore[assignment,misc]


class Normalize(nn.Module):
    """VecNormalize: clip((x - mean) / sqrt(var + eps), -clip, clip) in float64, then float32, as SB3 does."""

    def __init__(self, mean: np.ndarray, var: np.ndarray, epsilon: float, clip: float) -> None:
        super().__init__()
        self.register_buffer("mean", torch.from_numpy(np.array(mean, np.float64)))
        self.register_buffer("std", torch.from_numpy(np.sqrt(np.array(var, np.float64) + epsilon)))
        self.clip = float(clip)

    def forward(self, x: Tensor) -> Tensor:
        y = (x.to(torch.float64) - self.mean) / self.std
        return torch.clamp(y, -self.clip, self.clip).to(torch.float32)


class ChannelFirst(nn.Module):
    """[batch, H, W, C] -> [batch, C, H, W], as SB3's `maybe_transpose` does for a channel-last env."""

    def forward(self, x: Tensor) -> Tensor:
        return x.permute(0, 3, 1, 2)


class ToFloat(nn.Module):
    """`obs.float()`, divided by 255 for images when the policy normalizes them."""

    __constants__ = ["divide"]

    def __init__(self, divide: float) -> None:
        super().__init__()
        self.divide = float(divide)

    def forward(self, x: Tensor) -> Tensor:
        y = x.to(torch.float32)
        if self.divide != 1.0:
            y = y / self.divide
        return y


class OneHot(nn.Module):
    """Discrete / MultiDiscrete observations: concatenated one-hots of each entry, float32. Entries are taken with
    `select` on dim 1: `x[:, i]` adds a Slice on the batch dim whose symbolic size TVM's frontend cannot unify."""

    def __init__(self, sizes: list[int]) -> None:
        super().__init__()
        self.sizes = [int(n) for n in sizes]

    def forward(self, x: Tensor) -> Tensor:
        x = x.to(torch.int64).reshape(-1, len(self.sizes))
        parts: List[Tensor] = []
        for i, n in enumerate(self.sizes):
            parts.append(torch.nn.functional.one_hot(x.select(1, i), n).to(torch.float32))
        return torch.cat(parts, dim=1)


class LSTMStep(nn.Module):
    """One time step of RecurrentPPO's actor LSTM, layer by layer (no fused op). States come and go as
    [batch, layers, hidden] (SB3 keeps [layers, batch, hidden]); episode_start 1.0 zeroes the state first."""

    def __init__(self, lstm: Any) -> None:
        super().__init__()
        self.layers = nn.ModuleList([_LSTMLayer(lstm, k) for k in range(lstm.num_layers)])

    def forward(self, x: Tensor, state_h: Tensor, state_c: Tensor, episode_start: Tensor
                ) -> Tuple[Tensor, Tensor, Tensor]:
        keep = (1.0 - episode_start).reshape(1, -1, 1)
        h = state_h.transpose(0, 1) * keep
        c = state_c.transpose(0, 1) * keep
        hs: List[Tensor] = []
        cs: List[Tensor] = []
        for k, layer in enumerate(self.layers):
            x, c_k = layer(x, h[k], c[k])
            hs.append(x)
            cs.append(c_k)
        return x, torch.stack(hs, dim=1), torch.stack(cs, dim=1)


class _LSTMLayer(nn.Module):
    """The gates are sliced on dim 1 at constant offsets (`narrow`): `chunk` exports as Shape -> Gather -> Slice,
    which TVM's Relax ONNX frontend cannot import (shape_of on a shape), and `gates[:, a:b]` adds a Slice on the
    batch dim whose symbolic result (min(INT64_MAX, batch)) no longer matches the batch of the state."""

    __constants__ = ["hidden"]

    def __init__(self, lstm: Any, k: int) -> None:
        super().__init__()
        self.hidden = int(lstm.hidden_size)
        self.w_ih = nn.Parameter(getattr(lstm, f"weight_ih_l{k}").detach().clone())
        self.w_hh = nn.Parameter(getattr(lstm, f"weight_hh_l{k}").detach().clone())
        zeros = torch.zeros(self.w_ih.shape[0])
        self.b_ih = nn.Parameter(getattr(lstm, f"bias_ih_l{k}", zeros).detach().clone())
        self.b_hh = nn.Parameter(getattr(lstm, f"bias_hh_l{k}", zeros).detach().clone())

    def forward(self, x: Tensor, h: Tensor, c: Tensor) -> Tuple[Tensor, Tensor]:
        gates = torch.nn.functional.linear(x, self.w_ih, self.b_ih) + torch.nn.functional.linear(h, self.w_hh,
                                                                                                  self.b_hh)
        n = self.hidden
        i, f, g, o = gates.narrow(1, 0, n), gates.narrow(1, n, n), gates.narrow(1, 2 * n, n), gates.narrow(1, 3 * n, n)
        c2 = torch.sigmoid(f) * c + torch.sigmoid(i) * torch.tanh(g)
        return torch.sigmoid(o) * torch.tanh(c2), c2


class Argmax(nn.Module):
    """Deterministic categorical action(s): argmax per sub-space, int64; [batch] or [batch, n_sub]."""

    __constants__ = ["multi"]

    def __init__(self, sizes: list[int], multi: bool) -> None:
        super().__init__()
        self.sizes = [int(n) for n in sizes]
        self.multi = multi

    def forward(self, scores: Tensor) -> Tensor:
        if not self.multi:
            return torch.argmax(scores, dim=1)
        parts: List[Tensor] = []
        for part in torch.split(scores, self.sizes, dim=1):
            parts.append(torch.argmax(part, dim=1))
        return torch.stack(parts, dim=1)


class Bernoulli(nn.Module):
    """MultiBinary: round(sigmoid(logits)) as float32, i.e. logits > 0."""

    def forward(self, scores: Tensor) -> Tensor:
        return (scores > 0.0).to(torch.float32)


class BoxAction(nn.Module):
    """Box actions as predict returns them: optionally tanh, then rescaled from [-1, 1] or clipped to the bounds."""

    __constants__ = ["tanh", "rescale"]

    def __init__(self, shape: list[int], low: np.ndarray, high: np.ndarray, tanh: bool, rescale: bool) -> None:
        super().__init__()
        self.shape = [int(d) for d in shape]
        self.tanh = tanh
        self.rescale = rescale
        self.register_buffer("low", torch.from_numpy(np.array(low, np.float32)))
        self.register_buffer("high", torch.from_numpy(np.array(high, np.float32)))

    def forward(self, mean: Tensor) -> Tensor:
        a = mean.reshape([-1] + self.shape)
        if self.tanh:
            a = torch.tanh(a)
        if self.rescale:
            return self.low + (0.5 * (a + 1.0) * (self.high - self.low))
        return torch.minimum(torch.maximum(a, self.low), self.high)


class Mask(nn.Module):
    """MaskablePPO: illegal actions' scores to -inf (SB3 uses -1e8; the argmax over legal actions is the same).
    A scalar fill, not `full_like`: that exports as Shape -> ConstantOfShape, which TVM's frontend cannot import."""

    def forward(self, scores: Tensor, legal: Tensor) -> Tensor:
        return scores.masked_fill(torch.logical_not(legal), -math.inf)


# The network's forward, generated per signature: positional tensors in, fixed outputs, no lists across modules
# (a list input or output becomes ONNX Sequence ops, which TVM and TensorRT do not take).
_SOURCE = """
class {cls}(nn.Module):
    def __init__(self, paths, lstm, latent, head, mask, finish):
        super().__init__()
        for i, path in enumerate(paths):
            self.add_module("path" + str(i), path)
        self.lstm = lstm
        self.latent = latent
        self.head = head
        self.mask = mask
        self.finish = finish

    def forward(self, {params}) -> {ret}:
{body}
"""
_CLASSES: dict[tuple[Any, ...], type] = {}


def network(paths: list[Any], lstm: Any, latent: Any, head: Any, finish: Any, *, names: list[str],
            masked: bool, doc: str) -> Any:
    """One module: `names` as positional inputs (observations first, then action_masks, then state_h, state_c,
    episode_start) -> finish(head(latent(features))) [, next_state_h, next_state_c]."""
    params = _identifiers(names)
    n_obs = len(paths)
    feats = [f"self.path{i}({params[i]})" for i in range(n_obs)]
    body = ["features = " + (feats[0] if n_obs == 1 else f"torch.cat([{', '.join(feats)}], dim=1)")]
    if lstm is not None:
        h, c, start = params[-3:]
        body.append(f"features, next_h, next_c = self.lstm(features, {h}, {c}, {start})")
    body.append("scores = self.head(self.latent(features))")
    if masked:
        body.append(f"scores = self.mask(scores, {params[n_obs]})")
    body.append("return self.finish(scores)" if lstm is None else "return self.finish(scores), next_h, next_c")
    ret = "Tensor" if lstm is None else "Tuple[Tensor, Tensor, Tensor]"
    key = (tuple(params), tuple(body))
    if key not in _CLASSES:
        cls = f"Network{len(_CLASSES)}"
        source = _SOURCE.format(cls=cls, params=", ".join(f"{p}: Tensor" for p in params), ret=ret,
                                body="\n".join("        " + line for line in body))
        filename = f"<rlopt.sb3.graph {cls}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)   # inspect reads it
        namespace: dict[str, Any] = {"__name__": "rlopt.sb3.generated", "nn": nn, "Tensor": Tensor,
                                     "Tuple": Tuple, "torch": torch}
        exec(compile(source, filename, "exec"), namespace)  # noqa: S102 - our template; names are sanitized
        _CLASSES[key] = namespace[cls]
    identity = nn.Identity()
    module = _CLASSES[key](paths, lstm if lstm is not None else identity, latent, head,
                          Mask() if masked else nn.Identity(), finish)
    module.__doc__ = doc
    return module.eval().requires_grad_(False)   # an inference graph


def _identifiers(names: list[str]) -> list[str]:
    """Python parameter names for graph inputs (the ONNX names come from the recipe, these only read well)."""
    import keyword
    import re

    out: list[str] = []
    for index, name in enumerate(names):
        ident = re.sub(r"\W", "_", name)
        taken = ("self", "torch", "nn", "Tensor", "Tuple", "features", "scores", "next_h", "next_c")
        if not ident or ident[0].isdigit() or keyword.iskeyword(ident) or ident in taken or ident in out:
            ident = f"input{index}_{ident}"
        out.append(ident)
    return out


class AgentModel(nn.Module):
    """The agent as one model for a recipe: `actor`, and `value` where the algorithm has one."""

    def __init__(self, actor: Any, value: Any) -> None:
        super().__init__()
        self.actor = actor
        if value is not None:
            self.value = value
