"""The dashboard with a Kubernetes cluster (issue 34, item 6), on a real kube-apiserver: the nodes page lists the
cluster's nodes beside agents' nodes with their source and what gpupool allocated, and no node actions (kubectl
cordons them); the jobs page lists a pod's job. Screenshot: artifacts/nodes-kubernetes.png."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from live_dashboard import Tab

from gpupool.devtools import kube_cluster
from gpupool.devtools.harness import Server, start_server, stop_server, wait_for
from gpupool.devtools.kubelet_standin import KubeletStandIn

try:
    from playwright.sync_api import expect
except ImportError:  # the browser fixture skips
    expect = None


@pytest.fixture
def scheduled(tmp_path: Path) -> Iterator[Server]:
    """gpupool scheduling a cluster of one 2-GPU node that runs one half-GPU pod."""
    if kube_cluster.missing():
        pytest.skip(f"no Kubernetes control plane here: {kube_cluster.missing()}")
    from kubernetes import client

    cluster = kube_cluster.start(tmp_path / "k8s")
    api = cluster.api()
    core = client.CoreV1Api(api)
    server = None
    try:
        with KubeletStandIn(core):
            kube_cluster.add_node(core, "kube-gpu", gpus=2)
            server = start_server(tmp_path / "gpupool", env={"GPUPOOL_KUBECONFIG": str(cluster.kubeconfig),
                                                             "GPUPOOL_CYCLE_INTERVAL_S": "0.2"})
            core.create_namespaced_pod("default", kube_cluster.pod_body("notebook", fraction="0.5"),
                                       _preload_content=False)
            yield server
    finally:
        if server is not None:
            stop_server(server)
        api.close()
        cluster.stop()


def running(server: Server) -> dict[str, Any] | None:
    with server.client() as api:
        jobs = api.get("/jobs").json()["items"]
    return next((j for j in jobs if j["name"] == "notebook" and j["state"] == "running"), None)


def test_the_nodes_and_jobs_pages_show_the_clusters_nodes_and_pods(browser: Any, scheduled: Server) -> None:
    job = wait_for(lambda: running(scheduled), 60, "the pod's job running")
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    try:
        tab = Tab(context.new_page(), scheduled.url)
        tab.login(scheduled.token)
        tab.go("nodes")
        row = tab.page.locator('#nodes tr[data-node="kube-gpu"]')
        expect(row).to_contain_text("kubernetes")
        expect(row).to_contain_text("0.5 / 2")
        expect(row.locator("button[data-action]")).to_have_count(0)  # kubectl cordons and drains it
        tab.shot("nodes-kubernetes")
        tab.go("jobs")
        expect(tab.page.locator(f'tr[data-job="{job["id"]}"]')).to_contain_text("notebook")
        assert not tab.errors, tab.errors
    finally:
        context.close()
