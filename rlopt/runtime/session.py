"""`Session`: a loaded network, its input check (`check_feeds`) and the per-signature fast path."""

from __future__ import annotations

import threading
from typing import Any, Callable

import numpy as np

from rlopt.backends.base import Runner
from rlopt.manifest import InputProfile, NetworkRecord, shape_label


def check_feeds(feeds: dict[str, Any], profiles: dict[str, InputProfile]) -> dict[str, np.ndarray]:
    """Inputs must match names, dtype, rank and every dim in [min, max]; else a ValueError naming the input."""
    if not isinstance(feeds, dict):
        raise ValueError(f"Session.run takes a dict of input name -> numpy array, got {type(feeds).__name__}")
    unknown = sorted(set(feeds) - set(profiles))
    missing = sorted(set(profiles) - set(feeds))
    if unknown or missing:
        raise ValueError(
            f"inputs {sorted(feeds)} do not match the network's inputs {sorted(profiles)}"
            + (f"; unknown: {unknown}" if unknown else "")
            + (f"; missing: {missing}" if missing else "")
        )
    checked: dict[str, np.ndarray] = {}
    for name, profile in profiles.items():
        value = feeds[name]
        if not isinstance(value, np.ndarray):
            raise ValueError(f"input '{name}': expected a numpy array, got {type(value).__name__}")
        expected = np.dtype(profile.dtype)
        if value.dtype != expected:
            order = " (big-endian)" if value.dtype.byteorder == ">" else ""
            raise ValueError(
                f"input '{name}': dtype {value.dtype.str}{order} but the network takes {profile.dtype}; "
                f"fix: x.astype(np.{profile.dtype})"
            )
        if value.ndim != len(profile.min):
            raise ValueError(
                f"input '{name}': rank {value.ndim} (shape {list(value.shape)}) but the network takes rank "
                f"{len(profile.min)}, between {profile.min} and {profile.max}"
            )
        for axis, (dim, lo, hi) in enumerate(zip(value.shape, profile.min, profile.max)):
            if not lo <= dim <= hi:
                raise ValueError(
                    f"input '{name}': shape {list(value.shape)} is outside the compiled profile: dim {axis} is "
                    f"{dim}, allowed [{lo}, {hi}] (min {profile.min}, max {profile.max})"
                )
        checked[name] = value if value.flags.c_contiguous else np.ascontiguousarray(value)
    return checked


ShapeKey = tuple[tuple[int, ...], ...]
FAST_PATH_ENTRIES = 256


class Session:
    """A loaded network. `run` checks inputs first, so a bad shape never reaches a backend.

    Each (shape, dtype) combination is checked in full the first time it is seen and then remembered
    with the backend call that serves it, so a steady stream of requests costs one dict lookup.
    `backend` is the backend for the opt shape; `routes` says which backend serves which shape.
    """

    def __init__(self, runners: dict[str, Runner], routes: dict[ShapeKey, str], fallback: str, network: str,
                 record: NetworkRecord) -> None:
        self._runners = runners
        self._routes = routes
        self._fallback = fallback
        self.network = network
        self.inputs: dict[str, InputProfile] = dict(record.inputs)
        self.outputs: list[str] = list(record.outputs)
        self._names = list(record.inputs)
        opt = tuple(tuple(p.opt) for p in self.inputs.values())
        self.backend = routes.get(opt, fallback)
        self._fast: dict[tuple[Any, ...], Any] = {}
        self._local = threading.local()  # per thread: signature -> the runner's bound call (or None)

    @property
    def routes(self) -> dict[str, str]:
        """Backend per profile shape ('2x8x768' style keys) and for every other shape ('other')."""
        table = {shape_label(key): name for key, name in self._routes.items()}
        return table | {"other": self._fallback}

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        bound = getattr(self._local, "bound", None)
        try:
            arrays = [feeds[name] for name in self._names]
            key = tuple([(a.shape, a.dtype) for a in arrays if type(a) is np.ndarray and a.flags.c_contiguous])
            if len(feeds) == len(arrays):
                direct = bound.get(key) if bound is not None else None
                if direct is not None:
                    return direct(arrays)  # type: ignore[no-any-return]
                call = self._fast.get(key)
            else:
                call = None
        except (KeyError, TypeError):
            call = None
        if call is None:
            checked = check_feeds(feeds, self.inputs)
            arrays = [checked[name] for name in self._names]
            key = tuple([(a.shape, a.dtype) for a in arrays])
            call = self._ordered_call(self._runner_for(tuple(a.shape for a in arrays)))
            if all(a is feeds[n] for a, n in zip(arrays, self._names)) and len(self._fast) < FAST_PATH_ENTRIES:
                self._fast[key] = call
        outputs = dict(zip(self.outputs, call(arrays, key)))
        if key in self._fast and (bound is None or key not in bound):
            self._bind(key)
        return outputs

    def _bind(self, key: tuple[Any, ...]) -> None:
        """Once per thread and signature, after its first call: the runner's call for it as one function to the
        named outputs, when the runner has one (TVM's KernelChain)."""
        if not hasattr(self._local, "bound"):
            self._local.bound = {}
        self._local.bound[key] = self._runner_for(tuple(shape for shape, _ in key)).bound_call(key, self.outputs)

    def _runner_for(self, shapes: ShapeKey) -> Runner:
        return self._runners[self._routes.get(shapes, self._fallback)]

    def _ordered_call(self, runner: Runner) -> Callable[[list[np.ndarray], tuple[Any, ...]], list[np.ndarray]]:
        """The runner's call on inputs in input order and their ((shape, dtype), ...) signature."""
        return runner.infer_ordered

    def close(self) -> None:
        for runner in self._runners.values():
            runner.close()
        self._fast, self._local = {}, threading.local()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Session(network={self.network!r}, backend={self.backend!r})"


__all__ = ["FAST_PATH_ENTRIES", "Session", "ShapeKey", "check_feeds"]
