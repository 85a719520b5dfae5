"""`gpupool sim generate`: a multi-tenant workload at a chosen offered load, in the openb pod format.

Shapes and durations are drawn from a source pod list or job table (openb by default; pods that never ran are
skipped and durations are capped at `max_duration_s`, because pods still running at the trace's end
have censored lifetimes). The offered load is the load inside a measurement window of `days`, held steady: see
`generate`. Each job goes to a leaf
queue drawn by the tenant shares; a `gang_share` of them become gangs of 2 to 8 copies of their shape. A
`limit_share` of jobs carry a runtime limit of 1 to 3 times their duration (users overestimate).
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
    ran = [p for p in pods if (p.scheduled_time is not None or p.phase == "Succeeded")
           and p.creation_time is not None and p.deletion_time is not None and p.shape.gpu_count]
    if not ran:
        raise ValueError("generate: the source pod list has no GPU pods with times")
    return [(p, min(cap_s, pod_duration(p))) for p in ran]


@dataclass(frozen=True, slots=True)
class Generated:
    """What `generate` wrote: jobs, the window, and the offered load inside it against the target."""

    jobs: int
    #: the measurement window is [warmup_s, warmup_s + window_s) on the workload's clock
    warmup_s: int
    window_s: int
    capacity_gpus: int
    offered_gpu_s: float
    #: the cap on durations drawn from the source
    max_duration_s: int

    @property
    def offered_load(self) -> float:
        """Offered GPU-seconds inside the window / (cluster GPUs x window)."""
        return self.offered_gpu_s / (self.capacity_gpus * self.window_s)


#: arrivals are drawn this much faster than the target, then thinned at random down to the target work
OVERDRAW = 1.25


def generate(pods: Sequence[Pod], capacity_gpus: int, shares: Mapping[str, float], spec: WorkloadSpec,
             out: Path) -> Generated:
    """Write the workload CSV to `out`, at a steady offered load inside the window.

    Durations are capped at min(max_duration_s, a quarter of the window), and arrivals begin that cap before the
    window (a warm-up), so that the cluster is in steady state when the window opens; jobs still running at the
    window's end are cut there. Arrivals are a Poisson process drawn OVERDRAW times faster than the target needs,
    thinned uniformly at random (still Poisson) until the GPU-seconds offered inside the window reach `load` x
    capacity x window: the achieved load is the target to within one job."""
    rng = random.Random(spec.seed)
    window = int(spec.days * 86_400)
    cap = max(1, min(spec.max_duration_s, window // 4))
    samples = [(p, min(d, cap)) for p, d in _samples(pods, spec.max_duration_s)]
    mean_work = sum(p.shape.total_gpu_milli / 1000 * d for p, d in samples) / len(samples)
    rate = OVERDRAW * spec.load * capacity_gpus / (mean_work * (1 + spec.gang_share * 4))  # gangs: 5 copies, not 1
    queues, weights = list(shares), [shares[q] for q in shares]
    drawn: list[tuple[float, dict[str, object], float]] = []
    t = 0.0
    while (t := t + rng.expovariate(rate)) < cap + window:
        drawn.append((rng.random(), *_job(rng, samples, queues, weights, spec, int(t), (cap, cap + window))))
    target, offered, kept = spec.load * capacity_gpus * window, 0.0, []
    for _, row, work in sorted(drawn, key=lambda d: d[0]):
        if offered + work / 2 > target:
            break
        offered += work
        kept.append(row)
    kept.sort(key=lambda r: (r["creation_time"], r["name"]))
    _write(out, [{**r, "name": f"job-{n:06d}"} for n, r in enumerate(kept)])
    return Generated(len(kept), cap, window, capacity_gpus, offered, cap)


def _write(out: Path, rows: list[dict[str, object]]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", newline="") as handle:
        writer = SafeDictWriter(handle, COLUMNS, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def _job(rng: random.Random, samples: Sequence[tuple[Pod, int]], queues: list[str], weights: list[float],
         spec: WorkloadSpec, start: int, window: tuple[int, int]) -> tuple[dict[str, object], float]:
    """One drawn job's row (cut at the window's end) and the GPU-seconds it offers inside the window."""
    pod, duration = samples[rng.randrange(len(samples))]
    queue = rng.choices(queues, weights)[0]
    gang = rng.randint(2, 8) if rng.random() < spec.gang_share else 1
    end = min(start + duration, window[1])
    limit = str(round((end - start) * rng.uniform(1, 3))) if rng.random() < spec.limit_share else ""
    row = {"name": "", "cpu_milli": pod.shape.cpu_milli, "memory_mib": pod.shape.memory_mib,
           "num_gpu": pod.shape.gpu_count, "gpu_milli": pod.shape.gpu_milli, "gpu_spec": "|".join(pod.shape.gpu_models),
           "qos": pod.qos, "pod_phase": "Succeeded", "creation_time": start, "deletion_time": max(end, start + 1),
           "scheduled_time": start, "queue": queue, "user": f"{queue}-u{rng.randrange(spec.users_per_queue)}",
           "gang": gang, "runtime_limit_s": limit}
    inside = max(0, end - max(start, window[0]))
    return row, inside * gang * pod.shape.total_gpu_milli / 1000
