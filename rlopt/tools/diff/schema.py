"""The `rlopt diff` report (what --json prints): per network, latency per named shape, route, backend and file
changes, drift; and the regressions that make it exit 1."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, Field, computed_field

from rlopt.ci_config import CiConfig
from rlopt.tools.report import ToolReport


class Thresholds(CiConfig):
    """The thresholds applied: NEW_DIR's recipe `ci:` section, each flag given overriding its field."""

    source: dict[str, Literal["recipe", "flag"]] = Field(default_factory=dict,
                                                         description="where each threshold came from")


class ShapeLatency(BaseModel):
    """One named shape: the selected route of each MODEL_DIR timed now, interleaved (see rlopt.tools.diff.compare)."""

    point: str
    shape: dict[str, list[int]]
    old_route: str | None = Field(None, description="the backend `auto` runs at this shape in OLD_DIR")
    new_route: str | None = None
    old_us: float | None = Field(None, description="median over rounds of OLD_DIR's per-round block median")
    new_us: float | None = None
    ratio: float | None = Field(None, description="new / old, the median over rounds of the paired ratio")
    aa_noise: float | None = Field(None, description="how far two copies of one MODEL_DIR read apart here (>= 1)")
    rounds: int = 0
    confirm_ratio: float | None = Field(None, description="a shape whose ratio read as a regression is timed again: "
                                                          "the second ratio (a regression only if it is one too)")
    confirm_aa_noise: float | None = None
    regression: bool = False
    note: str = Field("", description="why no ratio, when there is none")


class DriftResult(BaseModel):
    """How far NEW_DIR's served outputs moved from OLD_DIR's on NEW_DIR's recorded reference inputs."""

    metric: Literal["kl", "relative_error", "max_abs"] = Field(
        description="the figure of the network's kind: policy kl (mean KL(old || new) per row), value "
                    "relative_error (||new - old|| / ||old||), generic max_abs")
    value: float
    kl_mean: float | None = None
    kl_max: float | None = None
    argmax_agree: float | None = Field(None, description="categorical policies: share of rows whose argmax agrees")
    max_abs: float
    max_rel: float
    relative_error: float
    compared: int = Field(description="calls compared (every recorded sample at every named shape)")
    regression: bool = False


class Change(BaseModel):
    """One route (shape label -> backend) or backend (name -> status) as each MODEL_DIR has it; None = absent."""

    name: str
    old: str | None
    new: str | None
    same_bytes: bool | None = Field(None, description="backends built in both: whether the artifact is unchanged")

    @property
    def changed(self) -> bool:
        return self.old != self.new


class FileChanges(BaseModel):
    """Files listed in the manifests, by path relative to MODEL_DIR."""

    added: list[str] = Field(default_factory=list)
    dropped: list[str] = Field(default_factory=list)
    changed: list[str] = Field(default_factory=list, description="in both, with another sha256")
    same: int = 0


class NetworkDiff(BaseModel):
    network: str
    kind: str
    status: Literal["compared", "added", "dropped"] = "compared"
    latency: list[ShapeLatency] = Field(default_factory=list)
    routes: list[Change] = Field(default_factory=list, description="`auto` routes by shape label (other = the rest)")
    backends: list[Change] = Field(default_factory=list)
    files: FileChanges = Field(default_factory=FileChanges)
    triton_models: FileChanges = Field(default_factory=FileChanges)
    drift: DriftResult | None = None
    regressions: dict[str, list[str]] = Field(default_factory=dict,
                                              description="check -> one line per regression it found")


class DiffReport(ToolReport):
    kind: str = "rlopt-diff"
    old_dir: str
    new_dir: str
    thresholds: Thresholds
    method: str
    budget_s: float
    seed: int | None = None
    networks: list[NetworkDiff]
    files: FileChanges = Field(default_factory=FileChanges, description="files outside the networks (recipe.yaml)")
    regressions: list[str] = Field(default_factory=list, description="one line per regression, network first")

    @computed_field  # type: ignore[prop-decorator]
    @property
    def passed(self) -> bool:
        return not self.regressions


__all__ = ["Change", "DiffReport", "DriftResult", "FileChanges", "NetworkDiff", "ShapeLatency", "Thresholds"]
