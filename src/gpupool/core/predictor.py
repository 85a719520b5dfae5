"""Runtime prediction for backfill (ALGORITHMS.md §10.1): what a job will probably run, from the
completed runtimes of similar jobs, never beyond its limit.

Keys fall back from (user, queue, shape) to (user, GPUs) to (user); the first level with at least
two completed runtimes answers with the nearest-rank quantile `q` of its last `history` runtimes,
at least `floor_s`. Without history the prediction is the job's limit (None if it has none).
"""

from __future__ import annotations

from collections import defaultdict, deque
from collections.abc import Hashable

from gpupool.core.metrics import nearest_rank
from gpupool.core.model import JobSpec


def _keys(job: JobSpec) -> list[tuple[Hashable, ...]]:
    user = job.user or job.queue
    shapes = tuple(sorted((t.shape.gpu_count, t.shape.gpu_milli, t.shape.cpu_milli) for t in job.tasks))
    gpus = sum(t.shape.total_gpu_milli for t in job.tasks)
    return [("shape", user, job.queue, shapes), ("gpus", user, gpus), ("user", user)]


class RuntimePredictor:
    def __init__(self, quantile_pct: int = 90, history: int = 10, floor_s: float = 60.0) -> None:
        if not 0 < quantile_pct <= 100 or history < 2 or floor_s < 0:
            raise ValueError("predictor: quantile_pct in (0, 100], history >= 2, floor_s >= 0")
        self.quantile_pct = quantile_pct
        self.floor_s = floor_s
        self._seen: dict[tuple[Hashable, ...], deque[float]] = defaultdict(lambda: deque(maxlen=history))

    def observe(self, job: JobSpec, runtime_s: float) -> None:
        """Record a completed run (not one killed at its limit: its true runtime is unknown)."""
        for key in _keys(job):
            self._seen[key].append(runtime_s)

    def predict(self, job: JobSpec) -> float | None:
        limit = job.runtime_limit_s
        for key in _keys(job):
            runs = self._seen.get(key)
            if runs is not None and len(runs) >= 2:
                guess = max(self.floor_s, nearest_rank(list(runs), self.quantile_pct))
                return guess if limit is None else min(limit, guess)
        return limit


def raised_after_overrun(started_at: float, expected_end: float, limit_end: float | None) -> float:
    """The new expected end of a task still running at its prediction: double it, never past the limit."""
    doubled = started_at + 2 * max(1.0, expected_end - started_at)
    return doubled if limit_end is None else min(limit_end, doubled)
