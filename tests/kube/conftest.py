"""A real Kubernetes control plane per test (etcd + kube-apiserver 1.20.2 from scripts/build-kube, on loopback),
fake GPU nodes as API objects, the labelled kubelet stand-in, and a gpupool control plane scheduling the cluster's
pods (`GPUPOOL_KUBECONFIG`). Each test gets its own cluster, so nodes (cluster-wide objects) never leak between
tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpupool.devtools import kube_cluster
from gpupool.devtools.harness import stop_server
from gpupool.devtools.kube_cluster import Testbed
from gpupool.devtools.kubelet_standin import KubeletStandIn

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="session")
def kube_binaries() -> None:
    """Build the binaries once if they are missing (scripts/build-kube; `make test` runs it first); skip only if
    the build is impossible here."""
    if kube_cluster.missing():
        built = subprocess.run([str(REPO / "scripts" / "build-kube")], capture_output=True, text=True)
        if built.returncode != 0 or kube_cluster.missing():
            pytest.skip(f"no kube-apiserver: {kube_cluster.missing()}; build-kube said: {built.stderr[-500:]}")


@pytest.fixture
def kube(kube_binaries: None, tmp_path: Path) -> Iterator[Testbed]:
    from kubernetes import client

    cluster = kube_cluster.start(tmp_path / "k8s")
    api = cluster.api()
    ctx = Testbed(cluster, client.CoreV1Api(api), tmp_path)
    try:
        with KubeletStandIn(ctx.core):
            yield ctx
    finally:
        if ctx.server is not None:
            stop_server(ctx.server)
        api.close()
        cluster.stop()
