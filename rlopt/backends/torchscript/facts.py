"""What the TorchScript build records (artifact facts of backend `torchscript`)."""

from __future__ import annotations

from rlopt.facts import ArtifactFacts


class TorchScriptFacts(ArtifactFacts):
    source: str | None = None


__all__ = ["TorchScriptFacts"]
