"""Shapes without their own static build, zero-padded into a bigger one: which dims may be padded (`PaddingPlan`,
read off the builds' facts) and the call that pads and cuts back (`PaddedCall`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from rlopt.arrays import ShapeKey

if TYPE_CHECKING:  # only for annotations: the facts' serving_variant imports this module without the chain's
    from rlopt.backends.tvm.chain import KernelChain

Follow = tuple[int, int]  # (input slot, dim)


@dataclass(frozen=True)
class PaddingPlan:
    """Along which input dims a shape may be zero-padded up to a bigger static build, and how to cut the outputs.

    Read off the static builds: an output dim follows an input dim when it equals it in every build and that input
    dim varies across builds (a batch or sequence dim); a varying input dim no output follows (one reduced away)
    is never padded. Rows padded with zeros leave the real rows unchanged only if the network treats rows
    independently, which this plan cannot know: the runtime pads only after the parity gate passed the `padded`
    variant (facts.variant_parity.padded), which pads each reference shape into a bigger build.
    """

    paddable: frozenset[Follow]
    follows: tuple[tuple[Follow | None, ...], ...]
    varying: frozenset[Follow]

    @property
    def covers_range(self) -> bool:
        """Every varying dim can be padded, so the largest build serves every shape up to it."""
        return self.varying <= self.paddable

    def bucket_for(self, shapes: ShapeKey, buckets: list[ShapeKey], *, strict: bool = False) -> ShapeKey | None:
        """The smallest build `shapes` pads into (equal on the other dims); with `strict`, never `shapes` itself."""
        def fits(bucket: ShapeKey) -> bool:
            return all(len(b) == len(s) and all(bd == sd or ((slot, d) in self.paddable and bd > sd)
                                                for d, (bd, sd) in enumerate(zip(b, s)))
                       for slot, (b, s) in enumerate(zip(bucket, shapes)))

        fitting = [b for b in buckets if len(b) == len(shapes) and fits(b) and not (strict and b == shapes)]
        return min(fitting, key=lambda b: sum(int(np.prod(dims)) for dims in b)) if fitting else None

    def cuts(self, shapes: ShapeKey) -> list[tuple[slice, ...]]:
        """Per output, the slice that holds the rows of an input of `shapes`."""
        return [tuple(slice(None) if f is None else slice(0, shapes[f[0]][f[1]]) for f in dims)
                for dims in self.follows]


def _shapes(build: Any) -> tuple[Mapping[str, Sequence[int]], list[list[int]] | None]:
    """A build's input shapes and static output shapes (a ShapeBuild, or its JSON)."""
    if isinstance(build, Mapping):
        return build["shapes"], build.get("output_shapes")
    return build.shapes, build.output_shapes


def padding_plan(builds: Sequence[Any], names: list[str]) -> PaddingPlan | None:
    """The PaddingPlan the static builds allow (each a ShapeBuild, or its JSON, listing `shapes` and
    `output_shapes`), or None."""
    read = [_shapes(b) for b in builds]
    if len(read) < 2 or any(not outputs for _, outputs in read):
        return None
    ins = [[list(shapes[n]) for n in names] for shapes, _ in read]
    outs = [outputs or [] for _, outputs in read]
    if len({len(o) for o in outs}) != 1:
        return None
    varying = {(slot, d) for slot in range(len(names)) for d in range(len(ins[0][slot]))
               if len({len(shape[slot]) for shape in ins}) == 1 and len({shape[slot][d] for shape in ins}) > 1}
    follows: list[tuple[Follow | None, ...]] = []
    for k, first in enumerate(outs[0]):
        if len({len(o[k]) for o in outs}) != 1:
            return None
        dims: list[Follow | None] = []
        for d in range(len(first)):
            values = [o[k][d] for o in outs]
            if len(set(values)) == 1:
                dims.append(None)
                continue
            matches = [f for f in sorted(varying) if [shape[f[0]][f[1]] for shape in ins] == values]
            if len(matches) != 1:  # an output dim no input dim explains, or two that do: cannot cut it back
                return None
            dims.append(matches[0])
        follows.append(tuple(dims))
    paddable = frozenset(f for dims in follows for f in dims if f is not None)
    return PaddingPlan(paddable, tuple(follows), frozenset(varying)) if paddable else None


@dataclass
class PaddedBucket:
    """A static build's chain used for smaller shapes; `corner` = whose data its zeroed buffers now hold."""

    chain: KernelChain
    corner: ShapeKey | None = None


class PaddedCall:
    """A shape without its own build, run in a bigger build: written into the leading corner of its zeroed input
    buffers, outputs cut back to the real rows."""

    def __init__(self, bucket: PaddedBucket, shapes: ShapeKey, cuts: list[tuple[slice, ...]]) -> None:
        self.bucket, self.shapes = bucket, shapes
        self.views = [buffer[tuple(slice(0, n) for n in shape)] for buffer, shape in zip(bucket.chain.buffers, shapes)]
        self.results = [output[cut] for output, cut in zip(bucket.chain.outputs, cuts)]

    def __call__(self, arrays: list[np.ndarray]) -> list[np.ndarray]:
        bucket = self.bucket
        if bucket.corner != self.shapes:  # another shape used this build last: its rows must not stay
            for buffer in bucket.chain.buffers:
                buffer.fill(0)
            bucket.corner = self.shapes
        for view, array in zip(self.views, arrays):
            np.copyto(view, array)
        bucket.chain.run_staged()
        return [result.copy() for result in self.results]


__all__ = ["PaddedBucket", "PaddedCall", "PaddingPlan", "padding_plan"]
