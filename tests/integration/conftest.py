"""End-to-end fixtures: a real control plane (SQLite) and real agent processes with fake GPUs on loopback, with the
RELIABILITY.md §2.2 timings scaled by about 1/20 (see agent_cluster.SCALED)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from agent_cluster import SCALED, Cluster


@pytest.fixture
def make_cluster(tmp_path: Path) -> Iterator[Callable[..., Cluster]]:
    """`make_cluster(**GPUPOOL_env_overrides)` starts a control plane; every one made is stopped after the test,
    with its agents and whatever workloads they left."""
    made: list[Cluster] = []

    def make(server_host: str | None = None, **env: str) -> Cluster:
        cluster = Cluster(tmp_path / f"cluster{len(made)}", env={**SCALED, **env}, server_host=server_host)
        made.append(cluster)
        return cluster.__enter__()

    yield make
    for cluster in reversed(made):
        cluster.__exit__(None, None, None)
    violations = [v for cluster in made for v in getattr(cluster, "violations", [])]
    assert not violations, "invariants broken:\n" + "\n".join(violations)


@pytest.fixture
def cluster(make_cluster: Callable[..., Cluster]) -> Cluster:
    return make_cluster()
