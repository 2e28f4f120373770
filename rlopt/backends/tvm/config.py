"""The recipe's `tvm` section."""

from __future__ import annotations

from typing import Any

from pydantic import Field, field_validator

from rlopt.spec import Strict

CUDA_KINDS = ("cuda",)


def is_cuda_target(target: dict[str, Any]) -> bool:
    return str(target.get("kind")) in CUDA_KINDS


class TvmConfig(Strict):
    target: dict[str, Any] = Field(default_factory=lambda: {"kind": "llvm"})
    tune_trials: int = Field(default=0, ge=0)
    # kernels without a tuning record get rlopt's CPU schedules (rlopt.backends.tvm.schedules); false keeps TVM's
    # default loop nests for them (serial, scalar: 10-100x slower beyond batch 1)
    schedule_rules: bool = True

    @field_validator("target")
    @classmethod
    def _target(cls, value: dict[str, Any]) -> dict[str, Any]:
        if "kind" not in value:
            raise ValueError("a TVM target dict needs 'kind', e.g. {kind: llvm} or {kind: cuda, arch: sm_86}")
        return value

    @property
    def on_cuda(self) -> bool:
        return is_cuda_target(self.target)


__all__ = ["CUDA_KINDS", "TvmConfig", "is_cuda_target"]
