"""TorchScript's refit hook: the new state loaded into the scripted module, saved over the artifact."""

from __future__ import annotations


from rlopt.backends.base import RefitInputs
from rlopt.facts import ArtifactFacts
from rlopt.lazy import require


def refit_artifact(inputs: RefitInputs) -> ArtifactFacts:
    torch = require("torch")
    path = inputs.network_dir / inputs.artifact
    scripted = torch.jit.load(str(path), map_location="cpu")
    scripted.load_state_dict({key: torch.from_numpy(value.copy()) for key, value in inputs.state.items()})
    torch.jit.save(scripted, str(path))
    return inputs.facts
