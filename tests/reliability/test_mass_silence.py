"""T8: the mass-disappearance guard (RELIABILITY.md §3.1, §2.2), and the liveness guard's rules in isolation.

End to end: a control plane (SQLite) and AGENTS real agents with fake GPUs, timings scaled by 1/20 (G = 3 s), the
requeue rate scaled too (2 nodes/s, burst 1), one job per node. Agents are silenced with SIGSTOP.

1. 60 % of the agents at once, for 2 G: more than `impaired_silent_share` (0.55) of the nodes went silent together,
   so the guard engages (`gpupool_cp_impaired` 1 on /metrics, once they are silent past suspect_after_s) and no
   node is declared lost: requeues stay within the configured rate (here 0). The agents are then resumed; once
   the guard lifts every node has a fresh G.
2. 20 % of the agents: a normal failure. Each is declared lost between G - 1.2 H (its last heartbeat, jittered,
   came before the stop) and G + 2 scans + H (+ the rate limit's spacing) after it fell silent; its job is
   requeued.
"""

from __future__ import annotations

import signal
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from agent_cluster import SCALED, Cluster, marker_command, wait_for

from gpupool.devtools.figures import figure
from gpupool.server.scheduler.liveness import LivenessGuard
from gpupool.server.settings import Settings

AGENTS = 10
G = float(SCALED["GPUPOOL_LOST_AFTER_S"])
H = float(SCALED["GPUPOOL_HEARTBEAT_S"])
SCAN = min(1.0, H)  # the monitor's period (AgentHub.monitor)
RATE = 2.0  # nodes/s: 0.1 node/s scaled by 20
ENV = {**SCALED, "GPUPOOL_REQUEUE_RATE_PER_S": str(RATE), "GPUPOOL_REQUEUE_BURST": "1",
       "GPUPOOL_METRICS_PUBLIC": "true"}  # the scraper reads cluster-wide series, which need no token then


class Scraper(threading.Thread):
    """Reads /metrics every 0.1 s: `impaired` holds (wall time, gpupool_cp_impaired)."""

    def __init__(self, url: str) -> None:
        super().__init__(name="scraper", daemon=True)
        self.url = url
        self.impaired: list[tuple[float, float]] = []
        self.halt = threading.Event()

    def run(self) -> None:
        while not self.halt.wait(0.1):
            try:
                self.impaired.append((time.time(), metrics(self.url)["gpupool_cp_impaired"]))
            except (httpx.HTTPError, KeyError):
                continue


def metrics(url: str) -> dict[str, float]:
    text = httpx.get(f"{url}/metrics", timeout=5).text
    return {line.split()[0]: float(line.split()[1]) for line in text.splitlines()
            if line and not line.startswith("#") and "{" not in line.split()[0]}


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    made = Cluster(tmp_path / "cluster", env=dict(ENV))
    made.__enter__()
    try:
        yield made
    finally:
        for agent in made.agents.values():
            if agent.alive:
                agent.signal(signal.SIGCONT)
        made.__exit__(None, None, None)
    violations = getattr(made, "violations", [])
    assert not violations, "invariants broken:\n" + "\n".join(violations)


def silence(cluster: Cluster, names: list[str]) -> float:
    for name in names:
        cluster.agents[name].signal(signal.SIGSTOP)
    return time.time()


def resume(cluster: Cluster, names: list[str]) -> None:
    for name in names:
        cluster.agents[name].signal(signal.SIGCONT)


def mass_silence(cluster: Cluster, scraper: Scraper, names: list[str]) -> dict[str, float]:
    """Phase 1: 60 % silent for 2 G; returns the lost count, requeues per second and whether the guard engaged."""
    before = metrics(cluster.url)
    start = silence(cluster, names)
    time.sleep(2 * G)
    during = metrics(cluster.url)
    resume(cluster, names)
    end = time.time()
    cluster.wait_ready(list(cluster.agents), timeout_s=30)
    engaged = [t - start for t, v in scraper.impaired if start < t < end and v == 1]
    requeues = during["gpupool_lost_requeues_total"] - before["gpupool_lost_requeues_total"]
    return {"lost": during["gpupool_nodes_lost_total"] - before["gpupool_nodes_lost_total"],
            "requeues_per_s": requeues / (end - start), "engaged": float(bool(engaged)),
            "engaged_after_s": engaged[0] if engaged else float("nan")}


def partial_silence(cluster: Cluster, names: list[str]) -> dict[str, float]:
    """Phase 2: 20 % silent until declared lost; returns detection times and requeues."""
    before = metrics(cluster.url)
    start = silence(cluster, names)
    lost_at: dict[str, float] = {}

    def all_lost() -> bool:
        nodes = cluster.nodes()
        lost_at.update({n: time.time() for n in names if nodes[n]["state"] == "lost" and n not in lost_at})
        return len(lost_at) == len(names)

    wait_for(all_lost, 4 * G, "the silenced nodes to be declared lost", step_s=0.05)
    after = metrics(cluster.url)
    resume(cluster, names)
    detect = sorted(t - start for t in lost_at.values())
    return {"lost": after["gpupool_nodes_lost_total"] - before["gpupool_nodes_lost_total"],
            "requeues": after["gpupool_lost_requeues_total"] - before["gpupool_lost_requeues_total"],
            "detect_min": detect[0], "detect_max": detect[-1]}


@pytest.mark.slow
def test_t8_mass_silence_engages_the_guard_and_a_partial_one_is_declared_lost(cluster: Cluster):
    names = [f"m{i}" for i in range(AGENTS)]
    for name in names:
        cluster.start_agent(name)
    cluster.wait_ready(names, timeout_s=90)
    jobs = [cluster.submit(command=marker_command(cluster.drop_box("markers"), 120), gpus="2") for _ in names]
    for job_id in jobs:
        cluster.wait_job(job_id, ("running",), timeout_s=60)
    scraper = Scraper(cluster.url)
    scraper.start()
    try:
        mass = mass_silence(cluster, scraper, names[: AGENTS * 6 // 10])
        for job_id in jobs:  # the resumed agents' fenced workloads are requeued and placed again
            cluster.wait_job(job_id, ("running",), timeout_s=60)
        partial = partial_silence(cluster, names[-AGENTS * 2 // 10:])
    finally:
        scraper.halt.set()
        scraper.join(5)
    low, bound = G - 1.2 * H, G + 2 * SCAN + H + (AGENTS * 2 // 10 - 1) / RATE  # the last beat: up to 1.2 H early
    within = low <= partial["detect_min"] and partial["detect_max"] <= bound + 0.5
    figure(f"T8  agents={AGENTS} silenced=60% guard={'engaged' if mass['engaged'] else 'NOT-engaged'} "
           f"engaged_after_s={mass['engaged_after_s']:.2f} "
           f"lost={mass['lost']:.0f} requeues_per_s={mass['requeues_per_s']:.2f} (limit {RATE:g}) ; silenced=20% "
           f"lost={partial['lost']:.0f} requeues={partial['requeues']:.0f} detect_s=[{partial['detect_min']:.2f},"
           f"{partial['detect_max']:.2f}] (bound {low:.2f}..{bound:.2f}) within_G={'yes' if within else 'no'}")
    assert mass["engaged"] and mass["lost"] == 0 and mass["requeues_per_s"] <= RATE, mass
    assert partial["lost"] == AGENTS * 2 // 10 and partial["requeues"] == AGENTS * 2 // 10, partial
    assert within, partial


# the guard's rules, without processes ---------------------------------------------------------------------------

SETTINGS = Settings(heartbeat_s=0.25, suspect_after_s=0.75, lost_after_s=3, max_disconnect_s=2, kill_grace_s=0.5,
                    requeue_rate_per_s=2, requeue_burst=1)


@pytest.mark.parametrize(("now", "quiet", "db_down_at", "want"), [
    (1.0, {"a": 0.0}, float("-inf"), "starting"),
    (10.0, {"a": 0.1, "b": 0.1, "c": 5.0}, float("-inf"), ""),
    (10.0, {"a": 0.1, "b": 0.1, "c": 5.0}, 8.0, "database unreachable"),
    (10.0, {"a": 0.1, "b": 0.1, "c": 5.0}, 6.9, ""),
    (10.0, {"a": 0.1, "b": 5.0, "c": 5.0}, float("-inf"), "2 of 3 nodes silent at once"),
    (10.0, {"a": 5.0, "b": 5.0}, float("-inf"), ""),  # too few nodes to call it a mass silence
], ids=["starting", "normal", "db-down-lately", "db-down-long-ago", "mass-silence", "two-nodes"])
def test_guard_reasons(now: float, quiet: dict[str, float], db_down_at: float, want: str):
    guard = LivenessGuard(SETTINGS, now=0.0)
    assert guard.check(now, quiet, db_down_at) == want
    assert guard.engaged == bool(want)


def test_guard_rate_limits_lost_nodes_and_holds_them_while_engaged():
    guard = LivenessGuard(SETTINGS, now=0.0)
    guard.check(10.0, {"a": 0.0}, float("-inf"))
    assert [guard.allow_lost(10.0) for _ in range(3)] == [True, False, False]  # burst 1
    assert not guard.allow_lost(10.4) and guard.allow_lost(10.5)  # 2 per second
    assert guard.allow_lost(20.0) and not guard.allow_lost(20.0)  # the bucket holds at most the burst
    guard.restart(30.0)
    assert guard.engaged and not guard.allow_lost(31.0)
