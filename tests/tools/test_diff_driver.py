"""rlopt.tools.diff.run_diff on real MODEL_DIRs of the tiny recipe: a copy, a wider network, dropped backends,
re-seeded weights, thresholds from the recipe and flags, and the MODEL_DIRs it refuses (exit 2).

Timings are injected (tests/tools/diff_common.py): no test here reads the clock.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from rlopt.errors import ArtifactError, UsageError
from rlopt.manifest import MANIFEST_NAME, read_manifest, write_json
from rlopt.tools.diff import run_diff
from rlopt.tools.diff.pair import compared_networks
from tests.conftest import CompileFactory, copy_model_dir
from tests.tools.diff_common import graph_bytes_timer, scaled_timer, tiny_variant


@pytest.fixture(scope="module")
def same(ort_compiled: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The candidate that changed nothing: a copy of the baseline."""
    return copy_model_dir(ort_compiled, tmp_path_factory.mktemp("same"))


@pytest.fixture(scope="module")
def wider(compiled: CompileFactory) -> Path:
    """The same interface with a 4x wider hidden layer: slower at every shape."""
    return compiled(tiny_variant(width=64), name="tiny.yaml")


@pytest.fixture(scope="module")
def reseeded(compiled: CompileFactory) -> Path:
    """New weights (another seed), and a `ci:` section asking for a drift threshold."""
    return compiled(tiny_variant(seed=4) + "ci:\n  max_drift_kl: 1.0e-6\n", name="tiny.yaml")


def test_the_same_build_passes_with_ratios_of_one_and_no_drift(ort_compiled: Path, same: Path) -> None:
    calls: list[tuple[str, tuple[str, ...]]] = []
    report = run_diff(ort_compiled, same, timer=scaled_timer(calls=calls), seed=5)
    assert report.passed and report.regressions == [] and report.seed == 5
    assert calls == [("policy", ("min", "opt", "max")), ("value", ("min", "opt", "max"))]
    for network in report.networks:
        assert [row.ratio for row in network.latency] == [1.0, 1.0, 1.0]
        assert network.drift is not None and network.drift.value == 0 and network.drift.compared == 12
        assert not any(change.changed for change in network.routes + network.backends)
        assert network.files.added == network.files.dropped == network.files.changed == []
        assert network.triton_models.added == network.triton_models.dropped == [] and network.triton_models.same >= 1
    policy_drift = report.networks[0].drift
    assert policy_drift is not None and policy_drift.metric == "kl" and policy_drift.argmax_agree == 1.0
    assert report.networks[1].drift is not None and report.networks[1].drift.metric == "relative_error"


def test_a_wider_network_is_slower_at_every_shape_and_each_is_named(ort_compiled: Path, wider: Path) -> None:
    report = run_diff(ort_compiled, wider, timer=graph_bytes_timer)
    latency = [line for line in report.regressions if ": latency " in line]
    assert len(latency) == 6 and not report.passed
    assert {line.split(":")[0] + ":" + line.split(":")[1] for line in latency} == {
        f"{net}: {shape}" for net in ("policy", "value") for shape in ("min 1x1x32", "opt 2x3x32", "max 4x6x32")}
    assert all(row.ratio is not None and row.ratio > 1.1 for net in report.networks for row in net.latency)
    assert all(net.drift is not None and not net.drift.regression for net in report.networks)  # reported only
    report = run_diff(ort_compiled, wider, timer=graph_bytes_timer, max_latency_ratio=10.0)
    assert report.passed and report.thresholds.source["max_latency_ratio"] == "flag"


def test_dropped_backends_are_regressions_unless_allowed(tiny_compiled: Path, ort_compiled: Path) -> None:
    built = {name for name, a in read_manifest(tiny_compiled).networks["policy"].artifacts.items() if a.built}
    assert {"torchscript", "tvm"} <= built
    report = run_diff(tiny_compiled, ort_compiled, ["policy"], timer=scaled_timer())
    dropped = sorted(line for line in report.regressions if "dropped" in line)
    assert dropped == [f"policy: backend {name} dropped: built in OLD_DIR, not in the recipe in NEW_DIR (allowed only "
                       "with ci.allow_dropped_backends: true)" for name in sorted(built - {"onnxruntime"})]
    assert run_diff(tiny_compiled, ort_compiled, ["policy"], timer=scaled_timer(), allow_dropped_backends=True).passed


def test_reseeded_weights_report_drift_and_fail_only_over_the_threshold(ort_compiled: Path, reseeded: Path) -> None:
    report = run_diff(ort_compiled, reseeded, timer=scaled_timer())
    assert report.thresholds.max_drift_kl == 1e-6 and report.thresholds.source["max_drift_kl"] == "recipe"
    policy, value = report.networks
    assert policy.drift is not None and policy.drift.kl_mean is not None and policy.drift.kl_mean > 1e-3
    assert policy.drift.argmax_agree is not None and policy.drift.argmax_agree < 1
    assert value.drift is not None and value.drift.relative_error > 0.1 and not value.drift.regression
    assert report.regressions == [f"policy: drift KL(old || new) mean {policy.drift.kl_mean:.3g} > max_drift_kl 1e-06, "
                                  f"argmax agreement {policy.drift.argmax_agree:.3f}"]
    relaxed = run_diff(ort_compiled, reseeded, timer=scaled_timer(), max_drift_kl=10.0)
    assert relaxed.passed and relaxed.thresholds.source["max_drift_kl"] == "flag"
    ort = next(change for change in policy.backends if change.name == "onnxruntime")
    assert (ort.old, ort.new, ort.same_bytes) == ("verified", "verified", False)  # new weights: new graph bytes
    assert "policy/model.onnx" in policy.files.changed


def resealed(model_dir: Path, folder: Path, drop_network: str) -> Path:
    """A copy of `model_dir` whose manifest no longer lists `drop_network` (sealed again: a valid MODEL_DIR)."""
    copy = copy_model_dir(model_dir, folder)
    manifest = read_manifest(copy)
    del manifest.networks[drop_network]
    shutil.rmtree(copy / drop_network)
    write_json(copy / MANIFEST_NAME, manifest.seal().model_dump(mode="json"))
    return copy


def test_a_network_dropped_is_a_regression_and_one_added_is_reported(ort_compiled: Path, tmp_path: Path) -> None:
    fewer = resealed(ort_compiled, tmp_path, "value")
    report = run_diff(ort_compiled, fewer, timer=scaled_timer())
    assert report.regressions == ["value: network dropped: in OLD_DIR, not in NEW_DIR"]
    assert [(n.network, n.status) for n in report.networks] == [("policy", "compared"), ("value", "dropped")]
    grown = run_diff(fewer, ort_compiled, timer=scaled_timer())
    assert grown.passed and [(n.network, n.status) for n in grown.networks] == [("policy", "compared"),
                                                                                  ("value", "added")]
    with pytest.raises(ArtifactError, match=r"manifest.json: networks: no network 'value' \(--network\)"):
        run_diff(ort_compiled, fewer, ["value"], timer=scaled_timer())


def test_networks_with_other_inputs_are_refused(ort_compiled: Path, tmp_path: Path) -> None:
    old = read_manifest(ort_compiled)
    new = old.model_copy(deep=True)
    new.networks["value"].inputs["input0"].max = [4, 6, 64]
    with pytest.raises(ArtifactError) as caught:
        compared_networks(ort_compiled, tmp_path, old, new, None)
    assert str(caught.value).startswith(f"{tmp_path / MANIFEST_NAME}: networks.value.inputs.input0: differs from "
                                        f"OLD_DIR {ort_compiled}: float32 min [1, 1, 32] opt [2, 3, 32] max [4, 6, 32]")
    assert compared_networks(ort_compiled, tmp_path, old, new, ["policy"]) == ["policy"]
    new.networks["policy"].outputs = ["other"]
    with pytest.raises(ArtifactError, match="networks.policy.outputs: differs"):
        compared_networks(ort_compiled, tmp_path, old, new, ["policy"])


def test_missing_and_corrupt_model_dirs_are_refused_before_timing(ort_compiled: Path, tmp_path: Path) -> None:
    calls: list[tuple[str, tuple[str, ...]]] = []
    with pytest.raises(ArtifactError, match="MODEL_DIR not found"):
        run_diff(tmp_path / "absent", ort_compiled, timer=scaled_timer(calls=calls))
    corrupt = copy_model_dir(ort_compiled, tmp_path)
    graph = corrupt / "value" / "model.onnx"
    graph.write_bytes(graph.read_bytes()[:-1] + b"\0")
    with pytest.raises(ArtifactError, match=r"value/model.onnx: sha256: does not match manifest.json"):
        run_diff(ort_compiled, corrupt, timer=scaled_timer(calls=calls))
    with pytest.raises(UsageError, match=r"--max-latency-ratio 0.5: .*greater than or equal to 1"):
        run_diff(ort_compiled, ort_compiled, max_latency_ratio=0.5, timer=scaled_timer(calls=calls))
    with pytest.raises(UsageError, match="--budget"):
        run_diff(ort_compiled, ort_compiled, budget_s=0, timer=scaled_timer(calls=calls))
    assert calls == []


def test_an_invalid_ci_section_in_new_dir_is_one_line(ort_compiled: Path, tmp_path: Path) -> None:
    from rlopt.manifest import file_record

    copy = copy_model_dir(ort_compiled, tmp_path)
    recipe = copy / "recipe.yaml"
    recipe.write_text(recipe.read_text() + "ci:\n  max_latency_ratio: fast\n")
    manifest = read_manifest(copy)
    manifest.recipe = file_record(copy, recipe)
    write_json(copy / MANIFEST_NAME, manifest.seal().model_dump(mode="json"))
    with pytest.raises(ArtifactError, match=r"recipe.yaml: ci.max_latency_ratio: Input should be a valid number"):
        run_diff(ort_compiled, copy, timer=scaled_timer())


def test_a_slower_reading_is_timed_again_and_kept_only_if_it_repeats(ort_compiled: Path, same: Path) -> None:
    calls: list[tuple[str, tuple[str, ...]]] = []
    readings = iter([{("policy", "max"): 1.5, ("policy", "min"): 1.3}, {("policy", "max"): 1.0,
                                                                         ("policy", "min"): 1.3}])

    def burst(*args: object) -> object:
        return scaled_timer(next(readings), calls)(*args)

    report = run_diff(ort_compiled, same, ["policy"], timer=burst)  # type: ignore[arg-type]
    assert calls == [("policy", ("min", "opt", "max")), ("policy", ("min", "max"))]
    rows = {row.point: row for row in report.networks[0].latency}
    assert (rows["max"].ratio, rows["max"].confirm_ratio, rows["max"].regression) == (1.5, 1.0, False)
    assert (rows["min"].ratio, rows["min"].confirm_ratio, rows["min"].regression) == (1.3, 1.3, True)
    assert rows["opt"].confirm_ratio is None
    (line,) = report.regressions
    assert line.startswith("policy: min 1x1x32: latency 1.30x") and line.endswith("; timed again: 1.30x, A/A noise 1.00")


def test_the_ci_section_rebuilds_nothing_and_sets_new_dirs_thresholds(ort_compiled: Path,
                                                                      compiled: CompileFactory) -> None:
    gated = compiled(tiny_variant() + "ci:\n  max_latency_ratio: 1.5\n  allow_dropped_backends: true\n",
                     name="tiny.yaml")
    manifest = read_manifest(gated)
    verdicts = [stage["cache"] for network in manifest.networks.values() for stage in network.stages if "cache" in stage]
    assert verdicts and set(verdicts) == {"hit"}  # every stage the baseline's compile cached
    report = run_diff(ort_compiled, gated, timer=scaled_timer({("value", "opt"): 1.4}))
    assert (report.thresholds.max_latency_ratio, report.thresholds.allow_dropped_backends) == (1.5, True)
    assert report.passed  # 1.4 is under NEW_DIR's own 1.5
    assert not run_diff(gated, ort_compiled, timer=scaled_timer({("value", "opt"): 1.4})).passed  # 1.10 there
