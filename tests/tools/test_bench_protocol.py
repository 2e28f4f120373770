"""The benchmark protocol's arithmetic: paired ratios, ONNX Runtime's best, the A/A noise, spread and verdicts."""

from __future__ import annotations

from pathlib import Path
from typing import get_args

import pytest

from rlopt.manifest import read_manifest
from rlopt.tools.bench import Skip, run_bench
from rlopt.tools.bench.candidates import AA_SUFFIX, OPENERS, PEER_PREFIX, CandidateKind, candidate_specs
from rlopt.tools.bench.protocol import aa_noise, ort_best, paired_ratio, peer_best, shape_ratios, spread, verdict
from tests.tools.common import CORES, ORT_BASELINES


def test_a_ratio_is_the_median_over_rounds_of_per_round_ratios() -> None:
    # round 2 is slow for both: paired, it cancels (unpaired medians would give 12 / 10 = 1.2)
    assert paired_ratio([10.0, 40.0, 12.0], [10.0, 40.0, 10.0]) == pytest.approx(1.0)
    assert paired_ratio([20.0, 30.0, 90.0], [10.0, 10.0, 10.0]) == pytest.approx(3.0)
    assert paired_ratio([2.0, 4.0, 6.0, 100.0], [1.0, 1.0, 1.0]) == pytest.approx(4.0)  # common rounds only
    with pytest.raises(ValueError):
        paired_ratio([], [1.0])


def test_ort_best_is_the_faster_plain_session_never_a_twin_or_rlopts_backend() -> None:
    rounds = {"onnxruntime 1 thread": [30.0, 31.0], "onnxruntime 2 threads": [20.0, 22.0],
              "onnxruntime 2 threads (A/A)": [5.0, 5.0], "rlopt onnxruntime": [1.0, 1.0], "rlopt auto": [2.0, 2.0]}
    assert ort_best(rounds) == "onnxruntime 2 threads"
    assert ort_best({"rlopt auto": [1.0]}) is None


def test_shape_ratios_pair_auto_eager_and_the_twin_with_the_best_session() -> None:
    rounds = {"onnxruntime 1 thread": [10.0, 10.0, 10.0], "onnxruntime 2 threads": [12.0, 12.0, 12.0],
              "onnxruntime 1 thread (A/A)": [11.0, 10.0, 10.5], "rlopt auto": [8.0, 9.0, 7.0],
              "pytorch eager": [30.0, 30.0, 30.0]}
    ratios = shape_ratios(rounds)
    assert ratios is not None
    assert ratios.peer_best == "onnxruntime 1 thread" and ratios.peer_best_us == 10.0
    assert (ratios.auto, ratios.aa, ratios.eager, ratios.sb3) == (0.8, 1.05, 3.0, None)
    assert shape_ratios({"rlopt auto": [1.0]}) is None


def test_a_peer_backend_faster_than_every_onnx_runtime_session_is_the_best_and_its_twin_the_noise() -> None:
    rounds = {"onnxruntime 1 thread": [10.0, 10.0], "onnxruntime 2 threads": [12.0, 12.0],
              "peer openvino": [8.0, 8.0], "peer openvino (A/A)": [8.4, 8.0], "rlopt auto": [9.0, 8.0]}
    assert ort_best(rounds) == "onnxruntime 1 thread" and peer_best(rounds) == "peer openvino"
    ratios = shape_ratios(rounds)
    assert ratios is not None and ratios.peer_best == "peer openvino" and ratios.auto == pytest.approx(1.0625)
    assert ratios.aa == pytest.approx(1.025)


def test_aa_noise_counts_either_copy_being_slower() -> None:
    assert aa_noise(1.1) == pytest.approx(1.1)
    assert aa_noise(1 / 1.1) == pytest.approx(1.1)
    assert aa_noise(1.0) == 1.0


def test_spread_is_min_max_and_relative_width() -> None:
    assert spread([0.9, 1.0, 1.035]) == pytest.approx((0.9, 1.035, 0.15))


def test_a_row_passes_within_the_noise_in_two_of_three_runs_and_never_above_the_ceiling() -> None:
    ok = verdict([1.0, 1.08, 1.19], [1.0, 1.04, 1.0])  # run 2: 1.08 <= 1.05 x 1.04; run 3 over but <= 1.2
    assert ok.passed and (ok.within, ok.needed, ok.worst) == (2, 2, 1.19)
    noisy_twin_slower_first = verdict([1.08, 1.0, 1.0], [1 / 1.04, 1.0, 1.0])  # a faster twin is noise too
    assert noisy_twin_slower_first.within == 3
    two_over = verdict([1.0, 1.1, 1.1], [1.0, 1.0, 1.0])
    assert not two_over.passed and two_over.reason == "within 1.05x A/A in 1 of 3 runs, needs 2"
    stalled = verdict([0.9, 0.95, 1.83], [1.0, 1.0, 1.0])
    assert not stalled.passed and stalled.reason == "worst run 1.83 > 1.2"
    assert verdict([1.04], [None]).passed and not verdict([1.06], [None]).passed  # one run: it must hold
    with pytest.raises(ValueError):
        verdict([1.0, 1.0], [1.0])


def test_the_protocol_set_is_auto_eager_and_each_onnxruntime_session_twice(tiny_compiled: Path) -> None:
    manifest = read_manifest(tiny_compiled)
    skipped: list[Skip] = []
    specs = candidate_specs(tiny_compiled, manifest, "policy", None, True, CORES, skipped, protocol=True)
    names = [spec.name for spec in specs]
    assert set(names) == {"rlopt auto", "pytorch eager"} | ORT_BASELINES | {n + AA_SUFFIX for n in ORT_BASELINES}
    twins = {spec.name: spec for spec in specs if spec.name.endswith(AA_SUFFIX)}
    for name, twin in twins.items():
        plain = next(spec for spec in specs if spec.name == name.removesuffix(AA_SUFFIX))
        assert (twin.kind, twin.threads, twin.model_dir) == (plain.kind, plain.threads, plain.model_dir)
    full = candidate_specs(tiny_compiled, manifest, "policy", None, True, CORES, [])
    assert not [s.name for s in full if s.name.endswith(AA_SUFFIX)] and "torchscript module" in {s.name for s in full}
    assert {s.kind for s in specs + full} <= set(OPENERS) == set(get_args(CandidateKind))


@pytest.mark.slow
def test_a_protocol_bench_records_every_round_of_every_candidate(tiny_compiled: Path) -> None:
    report = run_bench(tiny_compiled, "value", rounds=4, protocol=True, torch_compile=False)
    [network] = report.networks
    for shape in network.shapes:
        assert shape.rounds == 4
        assert set(shape.round_medians_us) == {r.candidate for r in shape.results}
        assert all(len(v) == 4 and min(v) > 0 for v in shape.round_medians_us.values())
        ratios = shape_ratios(shape.round_medians_us)
        assert ratios is not None and ratios.auto is not None and ratios.aa is not None and ratios.sb3 is None


def test_a_verified_peer_backend_joins_the_protocol_set_with_its_twin(tiny_compiled: Path) -> None:
    """A backend declared `bench_peer` (OpenVINO) is benched beside ONNX Runtime's sessions where it is verified."""
    from rlopt.backends import BACKENDS
    from rlopt.manifest import BackendRecord
    from rlopt.parity import Parity

    peer = next((name for name, backend in BACKENDS.items() if backend.bench_peer), None)
    if peer is None or BACKENDS[peer].unavailable(BACKENDS[peer].facts()) is not None:
        pytest.skip("no peer backend runs here")
    manifest = read_manifest(tiny_compiled)
    record = manifest.networks["policy"]
    passed = Parity(passed=True, max_abs=0.0, max_rel=0.0, compared=1, shapes=[], outputs=[])
    artifacts = {**record.artifacts, peer: BackendRecord(path="policy/model.xml", parity=passed,
                                                         facts=BACKENDS[peer].facts())}
    manifest.networks["policy"] = record.model_copy(update={"artifacts": artifacts})
    specs = candidate_specs(tiny_compiled, manifest, "policy", None, True, CORES, [], protocol=True)
    peers = [spec for spec in specs if spec.name.startswith(PEER_PREFIX)]
    assert [spec.name for spec in peers] == [PEER_PREFIX + peer, PEER_PREFIX + peer + AA_SUFFIX]
    assert all(spec.kind == "rlopt" and spec.backend == peer for spec in peers)
