"""`rlopt bench`: every built backend next to the baselines a user would otherwise pick, per profile shape.

`driver` runs it (worker processes, interleaved timed rounds), `candidates` says what runs and how a worker
opens it, `worker` is the worker process, `analysis` the statistics, `schema` the report.
Rendering (rich tables) is the CLI's: `rlopt.render.bench`.
"""

from rlopt.tools.bench.candidates import CandidateSpec, OpenCandidate
from rlopt.tools.bench.driver import DEFAULT_BUDGET_S, METHOD, CandidateFailed, run_bench, time_interleaved
from rlopt.tools.bench.schema import BenchReport, CandidateResult, NetworkBench, ShapeBench, Skip, WorkerInfo
from rlopt.tools.bench.worker import BLOCK_CALLS, WARMUP_CALLS

__all__ = [
           "BLOCK_CALLS",
           "DEFAULT_BUDGET_S",
           "METHOD",
           "WARMUP_CALLS",
           "BenchReport",
           "CandidateFailed",
           "CandidateResult",
           "CandidateSpec",
           "NetworkBench",
           "OpenCandidate",
           "ShapeBench",
           "Skip",
           "WorkerInfo",
           "run_bench",
           "time_interleaved",
]
