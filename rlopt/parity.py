"""Parity of compiled outputs against PyTorch, by network kind (contract section 4).

Returns result objects with statistics; a comparison that compared nothing fails.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from pydantic import BaseModel, ConfigDict, Field


class OutputParity(BaseModel):
    """One output of one backend against PyTorch, over every sample compared (contract section 7)."""

    model_config = ConfigDict(extra="forbid")

    name: str
    max_abs: float = Field(description="largest |backend - PyTorch| over finite values; inf on a NaN/inf mismatch")
    max_rel: float = Field(description="largest |backend - PyTorch| / |PyTorch|")
    needed_atol: float = Field(description="the smallest atol that would pass at the recipe's rtol")
    passed: bool
    kl: float | None = Field(default=None, description="a policy head (its first output): largest KL(PyTorch || backend) of a row")
    argmax_agree: float | None = Field(default=None, description="a categorical policy head: share of rows whose "
                                       "argmax agrees")
    reason: str = Field(default="", description="why it failed, naming the shape or step")


class Parity(BaseModel):
    """One backend against PyTorch over every recorded sample: the worst figures and each output's."""

    model_config = ConfigDict(extra="forbid")

    passed: bool
    max_abs: float
    max_rel: float
    kl: float | None = None
    argmax_agree: float | None = None
    compared: int
    shapes: list[str]
    outputs: list[OutputParity]


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


def masked_categorical_kl(ref_logits: np.ndarray, out_logits: np.ndarray, legal: np.ndarray) -> np.ndarray:
    """KL(softmax(ref) || softmax(out)) per row over the `legal` actions only (a row with none gives 0)."""
    ref = np.where(legal, ref_logits.astype(np.float64), -np.inf)
    out = np.where(legal, out_logits.astype(np.float64), -np.inf)
    any_legal = legal.any(axis=-1, keepdims=True)
    ref = np.where(any_legal, ref, 0.0)
    out = np.where(any_legal, out, 0.0)
    with np.errstate(invalid="ignore", over="ignore"):
        log_p, log_q = _log_softmax(ref), _log_softmax(out)
        terms = np.where(legal | ~any_legal, np.exp(log_p) * (log_p - log_q), 0.0)
    return np.where(any_legal[..., 0], terms.sum(axis=-1), 0.0)


def masked_argmax(logits: np.ndarray, legal: np.ndarray) -> np.ndarray:
    """argmax over the legal actions (NaN counts as no action)."""
    values = np.where(legal & ~np.isnan(logits), logits.astype(np.float64), -np.inf)
    return values.argmax(axis=-1)


def _first_index(mask: np.ndarray) -> tuple[int, ...]:
    return tuple(int(i) for i in np.argwhere(mask)[0])


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
    where: str = ""  # the shape / step being compared, named in failure reasons

    def __post_init__(self) -> None:
        self.stats = {name: _OutputStats(name) for name in self.names}

    def add(self, reference: list[np.ndarray], compiled: list[np.ndarray], count: int = 1) -> None:
        """Compare one call's outputs, or `count` calls' stacked on a leading sample axis."""
        if len(compiled) != len(reference):
            first = self.stats[self.names[0]]
            first.reason = f"backend returned {len(compiled)} outputs, expected {len(reference)}"
            return
        for name, ref, out in zip(self.names, reference, compiled):
            self._elementwise(self.stats[name], np.asarray(ref), np.asarray(out))
        if self.kind == "policy":
            self._policy(reference, compiled)
        self.compared += count

    def _elementwise(self, stats: _OutputStats, ref: np.ndarray, out: np.ndarray) -> None:
        """Contract section 7: |ref - out| <= atol + rtol * |ref| on finite values; infinities equal in place and
        sign; a NaN in the reference fails (naming the output), a NaN in the output where the reference
        has a number fails."""
        if ref.shape != out.shape:
            stats.reason = stats.reason or f"shape {list(out.shape)} but PyTorch gives {list(ref.shape)}{self._at()}"
            stats.within = False
            return
        if ref.dtype.kind in "biu" and out.dtype.kind in "biu":
            diff = np.abs(ref.astype(np.int64) - out.astype(np.int64)).astype(np.float64)
            stats.max_abs = max(stats.max_abs, float(diff.max(initial=0)))
            stats.within &= bool((diff == 0).all())
            return
        ref64, out64 = ref.astype(np.float64), out.astype(np.float64)
        ref_nan, out_nan = np.isnan(ref64), np.isnan(out64)
        if ref_nan.any():
            stats.within = False
            stats.reason = stats.reason or (f"PyTorch's output '{stats.name}' holds NaN at {_first_index(ref_nan)}"
                                            f"{self._at()}: nothing to compare against")
        if (out_nan & ~ref_nan).any():
            stats.within = False
            stats.reason = stats.reason or (f"output '{stats.name}' is NaN at {_first_index(out_nan & ~ref_nan)} "
                                            f"where PyTorch gives a number{self._at()}")
        ref_inf, out_inf = np.isinf(ref64), np.isinf(out64)
        inf_mismatch = (ref_inf | out_inf) & ~ref_nan & ~out_nan & (ref64 != out64)
        if inf_mismatch.any():
            stats.within = False
            index = _first_index(inf_mismatch)
            stats.reason = stats.reason or (f"output '{stats.name}' at {index} is {out64[index]} where PyTorch gives "
                                            f"{ref64[index]}{self._at()}: infinities must match in place and sign")
        finite = np.isfinite(ref64) & np.isfinite(out64)
        with np.errstate(invalid="ignore", over="ignore"):
            diff = np.where(finite, np.abs(ref64 - out64), 0.0)
        scale = np.where(finite, np.abs(ref64), 0.0)
        worst = np.inf if (inf_mismatch.any() or (out_nan & ~ref_nan).any()) else 0.0
        stats.max_abs = max(stats.max_abs, float(diff.max(initial=0)), worst)
        stats.max_rel = max(stats.max_rel, float((diff / np.maximum(scale, 1e-12)).max(initial=0)), worst)
        needed = float(np.maximum(diff - self.tol.rtol * scale, 0).max(initial=0))
        stats.needed_atol = max(stats.needed_atol, needed)
        stats.within &= bool((diff <= self.tol.atol + self.tol.rtol * scale).all())

    def _at(self) -> str:
        return f" ({self.where})" if self.where else ""

    def _policy(self, reference: list[np.ndarray], compiled: list[np.ndarray]) -> None:
        head = self.stats[self.names[0]]
        if self.distribution == "gaussian":
            if len(reference) < 2:
                head.reason = "a gaussian policy needs outputs [mean, log_std]"
                return
            kl = gaussian_kl(reference[0], reference[1], compiled[0], compiled[1])
        else:
            ref, out = np.asarray(reference[0], np.float64), np.asarray(compiled[0], np.float64)
            if ref.shape != out.shape:
                return  # the elementwise check has failed and said why
            # KL and argmax over the finite (legal) actions of the reference only: a masked -inf is no action
            legal = np.isfinite(ref)
            rows = legal.any(axis=-1)
            kl = masked_categorical_kl(ref, out, legal)[rows]
            ref_top, out_top = masked_argmax(ref, legal), masked_argmax(out, legal)
            agree = (ref_top == out_top)[rows]
            head.agree_rows += int(agree.sum())
            head.rows += int(agree.size)
            if not agree.all():
                ordered = np.sort(np.where(legal, ref, -np.inf), axis=-1)[rows]
                margin = ordered[..., -1] - ordered[..., -2] if ref.shape[-1] > 1 else np.full(agree.shape, np.inf)
                margin = np.where(np.isfinite(margin), margin, np.inf)  # a single legal action cannot tie
                tie = margin <= self.tol.atol
                head.tie_only &= bool(tie[~agree].all())
                if not head.tie_only and not head.reason:
                    head.reason = f"argmax differs where PyTorch's top two are more than atol apart{self._at()}"
        kl_value = float(np.nan_to_num(np.asarray(kl, np.float64), nan=np.inf).max(initial=0))
        head.kl = max(head.kl or 0.0, kl_value)
        self.kl_max = head.kl
        if kl_value > self.tol.max_kl and not head.reason:
            head.reason = f"KL {kl_value:.3g} > max_kl {self.tol.max_kl:.3g}{self._at()}"

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


def failure_reasons(parity: Parity) -> str:
    """What a failed parity says, one clause per failing output, each naming it (a NaN in PyTorch's output or in the
    compiled one says NaN); '' when it passed."""
    if parity.passed:
        return ""
    if parity.compared == 0:
        return "nothing was compared"
    clauses = []
    for out in parity.outputs:
        if out.passed:
            continue
        reason = out.reason or (f"outside atol/rtol (max_abs {out.max_abs:.3g}, max_rel {out.max_rel:.3g}; atol "
                                f"{out.needed_atol:.3g} would pass)")
        clauses.append(reason if f"'{out.name}'" in reason else f"output '{out.name}': {reason}")
    return "; ".join(clauses)


def run_parity(infer: Callable[[dict[str, np.ndarray]], list[np.ndarray]], reference: Any, kind: str,
               distribution: str, tol: Tolerance) -> Parity:
    """Every recorded sample through `infer`, compared with PyTorch's outputs (the one parity gate).

    For a network with recurrent state (`reference.state`, input -> output), each sample runs
    `reference.steps(point)` steps: the backend's own next state is fed back as the next step's state input
    and every step is compared with PyTorch's (which fed back its own).
    """
    accumulator = ParityAccumulator(kind, distribution, reference.output_names, tol)
    accumulator.shapes = [f"{point} {reference.shape(point)}" for point in reference.points]
    state = dict(getattr(reference, "state", {}) or {})
    index_of = {name: i for i, name in enumerate(reference.output_names)}
    for point in reference.points:
        if not state:
            _compare_point(accumulator, infer, reference, point)
            continue
        steps = reference.steps(point)
        for sample in range(reference.samples(point)):
            produced: list[np.ndarray] = []
            for step in range(steps):
                feeds = reference.step_feeds(point, sample, step) if step else reference.feeds(point, sample)
                for state_input, state_output in state.items():
                    if step:
                        feeds[state_input] = np.ascontiguousarray(
                            np.asarray(produced[index_of[state_output]]).astype(feeds[state_input].dtype))
                accumulator.where = f"{point} sample {sample}" + (f" step {step}" if state else "")
                produced = [np.asarray(value) for value in infer(feeds)]
                expected = reference.step_outputs(point, sample, step) if step else reference.outputs(point, sample)
                accumulator.add(expected, produced)
                if len(produced) != len(expected):
                    break
    accumulator.where = ""
    return accumulator.result()


def _compare_point(accumulator: ParityAccumulator, infer: Callable[[dict[str, np.ndarray]], list[np.ndarray]],
                   reference: Any, point: str) -> None:
    """A stateless point: every sample through `infer`, then one comparison of the samples stacked on a leading
    axis (the same rule, far fewer numpy calls); a sample whose outputs do not match in number or shape is
    compared alone, so its reason names it."""
    expected_all: list[list[np.ndarray]] = []
    produced_all: list[list[np.ndarray]] = []
    for sample in range(reference.samples(point)):
        produced = [np.array(value) for value in infer(reference.feeds(point, sample))]  # a copy: kept past the next call
        expected = [np.asarray(value) for value in reference.outputs(point, sample)]
        if len(produced) != len(expected) or any(p.shape != e.shape for p, e in zip(produced, expected)):
            accumulator.where = f"{point} sample {sample}"
            accumulator.add(expected, produced)
            continue
        expected_all.append(expected)
        produced_all.append(produced)
    if produced_all:
        accumulator.where = f"{point}, first index = sample"
        accumulator.add([np.stack(column) for column in zip(*expected_all)],
                        [np.stack(column) for column in zip(*produced_all)], count=len(produced_all))
