"""Parity of compiled outputs against PyTorch, by network kind (contract section 4).

Returns result objects with statistics; a comparison that compared nothing fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from rlopt.manifest import OutputParity, Parity


@dataclass(frozen=True)
class Tolerance:
    atol: float
    rtol: float
    max_kl: float


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    shifted = x - x.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def categorical_kl(ref_logits: np.ndarray, out_logits: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(out)) per row (last axis = actions)."""
    log_p, log_q = _log_softmax(ref_logits), _log_softmax(out_logits)
    return (np.exp(log_p) * (log_p - log_q)).sum(axis=-1)


def gaussian_kl(ref_mean: np.ndarray, ref_log_std: np.ndarray, mean: np.ndarray, log_std: np.ndarray) -> np.ndarray:
    """KL(N_ref || N_out) for diagonal Gaussians, summed over the action axis."""
    ref_mean, mean = ref_mean.astype(np.float64), mean.astype(np.float64)
    ref_log_std, log_std = np.broadcast_to(ref_log_std, ref_mean.shape), np.broadcast_to(log_std, mean.shape)
    var_ratio = np.exp(2 * (ref_log_std - log_std))
    term = (log_std - ref_log_std) + 0.5 * (var_ratio + (ref_mean - mean) ** 2 / np.exp(2 * log_std)) - 0.5
    return term.sum(axis=-1)


@dataclass
class _OutputStats:
    name: str
    max_abs: float = 0.0
    max_rel: float = 0.0
    needed_atol: float = 0.0
    within: bool = True
    kl: float | None = None
    agree_rows: int = 0
    rows: int = 0
    tie_only: bool = True
    reason: str = ""

    def result(self, policy_head: bool) -> OutputParity:
        agree = (self.agree_rows / self.rows) if (policy_head and self.rows) else None
        passed = self.within and (not policy_head or self.tie_only) and not self.reason
        return OutputParity(name=self.name, max_abs=self.max_abs, max_rel=self.max_rel,
                            needed_atol=self.needed_atol, passed=passed, kl=self.kl,
                            argmax_agree=agree, reason=self.reason)


@dataclass
class ParityAccumulator:
    """Feed it (reference, compiled) output pairs, sample by sample; `result()` gives the verdict."""

    kind: str
    distribution: str
    names: list[str]
    tol: Tolerance
    stats: dict[str, _OutputStats] = field(default_factory=dict)
    compared: int = 0
    shapes: list[str] = field(default_factory=list)
    kl_max: float | None = None

    def __post_init__(self) -> None:
        self.stats = {name: _OutputStats(name) for name in self.names}

    def add(self, reference: list[np.ndarray], compiled: list[np.ndarray]) -> None:
        if len(compiled) != len(reference):
            first = self.stats[self.names[0]]
            first.reason = f"backend returned {len(compiled)} outputs, expected {len(reference)}"
            return
        for name, ref, out in zip(self.names, reference, compiled):
            self._elementwise(self.stats[name], np.asarray(ref), np.asarray(out))
        if self.kind == "policy":
            self._policy(reference, compiled)
        self.compared += 1

    def _elementwise(self, stats: _OutputStats, ref: np.ndarray, out: np.ndarray) -> None:
        if ref.shape != out.shape:
            stats.reason = f"shape {list(out.shape)} but PyTorch gives {list(ref.shape)}"
            stats.within = False
            return
        if ref.dtype.kind in "biu":
            diff = np.abs(ref.astype(np.int64) - out.astype(np.int64)).astype(np.float64)
            stats.max_abs = max(stats.max_abs, float(diff.max(initial=0)))
            stats.within &= bool((diff == 0).all())
            return
        ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
        diff = np.abs(ref64 - out64)
        diff = np.where(np.isnan(ref64) & np.isnan(out64), 0.0, diff)
        diff = np.where(np.isnan(diff), np.inf, diff)
        scale = np.abs(ref64)
        stats.max_abs = max(stats.max_abs, float(diff.max(initial=0)))
        stats.max_rel = max(stats.max_rel, float((diff / np.maximum(scale, 1e-12)).max(initial=0)))
        needed = float(np.maximum(diff - self.tol.rtol * scale, 0).max(initial=0))
        stats.needed_atol = max(stats.needed_atol, needed)
        stats.within &= bool((diff <= self.tol.atol + self.tol.rtol * scale).all())

    def _policy(self, reference: list[np.ndarray], compiled: list[np.ndarray]) -> None:
        head = self.stats[self.names[0]]
        if self.distribution == "gaussian":
            if len(reference) < 2:
                head.reason = "a gaussian policy needs outputs [mean, log_std]"
                return
            kl = gaussian_kl(reference[0], reference[1], compiled[0], compiled[1])
        else:
            ref, out = reference[0], compiled[0]
            kl = categorical_kl(ref, out)
            ref_top, out_top = ref.argmax(axis=-1), out.argmax(axis=-1)
            agree = ref_top == out_top
            head.agree_rows += int(agree.sum())
            head.rows += int(agree.size)
            if not agree.all():
                ordered = np.sort(ref.astype(np.float64), axis=-1)
                margin = ordered[..., -1] - ordered[..., -2] if ref.shape[-1] > 1 else np.full(agree.shape, np.inf)
                tie = margin <= self.tol.atol + self.tol.rtol * np.abs(ordered[..., -1])
                head.tie_only &= bool(tie[~agree].all())
        kl_value = float(np.nan_to_num(kl, nan=np.inf).max(initial=0))
        head.kl = max(head.kl or 0.0, kl_value)
        self.kl_max = head.kl
        if kl_value > self.tol.max_kl and not head.reason:
            head.reason = f"KL {kl_value:.3g} > max_kl {self.tol.max_kl:.3g}"

    def result(self) -> Parity:
        outputs = [self.stats[name].result(self.kind == "policy" and i == 0) for i, name in enumerate(self.names)]
        head = outputs[0]
        passed = self.compared > 0 and all(o.passed for o in outputs)
        return Parity(
            passed=passed,
            max_abs=max(o.max_abs for o in outputs),
            max_rel=max(o.max_rel for o in outputs),
            kl=head.kl if self.kind == "policy" else None,
            argmax_agree=head.argmax_agree if self.kind == "policy" else None,
            compared=self.compared,
            shapes=list(self.shapes),
            outputs=outputs,
        )
