"""`gpupool sim generate`: a multi-tenant workload at a chosen offered load, in the openb pod format.

Shapes and durations are drawn from a source pod list (openb by default; pods that never ran are
skipped and durations are capped at `max_duration_s`, because pods still running at the trace's end
have censored lifetimes). Jobs arrive as a Poisson process whose rate gives the offered load
(GPU-seconds requested per second over cluster GPUs); each job goes to a leaf queue drawn by the
tenant shares; a `gang_share` of them become gangs of 2 to 8 copies of their shape. A `limit_share`
of jobs carry a runtime limit of 1 to 3 times their duration (users overestimate).
"""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from gpupool.protocol.csvsafe import SafeDictWriter
from gpupool.sim.traces.openb import Pod, pod_duration

COLUMNS = ("name", "cpu_milli", "memory_mib", "num_gpu", "gpu_milli", "gpu_spec", "qos", "pod_phase",
           "creation_time", "deletion_time", "scheduled_time", "queue", "user", "gang", "runtime_limit_s")


@dataclass(frozen=True, slots=True)
class WorkloadSpec:
    load: float = 0.9
    days: float = 3.0
    gang_share: float = 0.05
    limit_share: float = 0.5
    max_duration_s: int = 86_400
    users_per_queue: int = 3
    seed: int = 0

    def __post_init__(self) -> None:
        checks = {"load": 0 < self.load <= 10, "days": 0 < self.days <= 365, "gang_share": 0 <= self.gang_share <= 1,
                  "limit_share": 0 <= self.limit_share <= 1, "max_duration_s": self.max_duration_s >= 60,
                  "users_per_queue": self.users_per_queue >= 1}
        bad = [k for k, ok in checks.items() if not ok]
        if bad:
            raise ValueError(f"{bad[0]}: out of range")


def _samples(pods: Sequence[Pod], cap_s: int) -> list[tuple[Pod, int]]:
    ran = [p for p in pods if p.scheduled_time is not None and p.deletion_time is not None and p.shape.gpu_count]
    if not ran:
        raise ValueError("generate: the source pod list has no GPU pods with times")
    return [(p, min(cap_s, pod_duration(p))) for p in ran]


def generate(pods: Sequence[Pod], capacity_gpus: int, shares: Mapping[str, float], spec: WorkloadSpec,
             out: Path) -> int:
    """Write the workload CSV to `out`; returns the number of jobs."""
    rng = random.Random(spec.seed)
    samples = _samples(pods, spec.max_duration_s)
    mean_work = sum(p.shape.total_gpu_milli / 1000 * d for p, d in samples) / len(samples)
    mean_work *= 1 + spec.gang_share * 4  # gangs average 5 copies instead of 1
    rate = spec.load * capacity_gpus / mean_work
    queues, weights = list(shares), [shares[q] for q in shares]
    horizon = spec.days * 86_400
    rows, t, n = [], 0.0, 0
    while True:
        t += rng.expovariate(rate)
        if t >= horizon:
            break
        pod, duration = samples[rng.randrange(len(samples))]
        queue = rng.choices(queues, weights)[0]
        gang = rng.randint(2, 8) if rng.random() < spec.gang_share else 1
        limit = str(round(duration * rng.uniform(1, 3))) if rng.random() < spec.limit_share else ""
        start = int(t)
        rows.append({"name": f"job-{n:06d}", "cpu_milli": pod.shape.cpu_milli, "memory_mib": pod.shape.memory_mib,
                     "num_gpu": pod.shape.gpu_count, "gpu_milli": pod.shape.gpu_milli,
                     "gpu_spec": "|".join(pod.shape.gpu_models), "qos": pod.qos, "pod_phase": "Succeeded",
                     "creation_time": start, "deletion_time": start + duration, "scheduled_time": start,
                     "queue": queue, "user": f"{queue}-u{rng.randrange(spec.users_per_queue)}", "gang": gang,
                     "runtime_limit_s": limit})
        n += 1
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = SafeDictWriter(handle, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)
    return len(rows)
