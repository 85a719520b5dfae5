"""The informers keep up with the apiserver: list, then watch from the list's resourceVersion; a version the
apiserver no longer has (its history compacted) answers 410 Gone, and the informer lists again."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from gpupool.devtools import kube_cluster
from gpupool.devtools.harness import wait_for
from gpupool.devtools.kube_cluster import add_node, pod_body
from gpupool.server.kube.client import KubeClient
from gpupool.server.kube.informer import Gone, Informer
from gpupool.server.kube.objects import node_of, pod_of


@pytest.fixture
def uncached(kube_binaries: None, tmp_path: Path) -> Iterator[kube_cluster.KubeCluster]:
    """A cluster whose apiserver watches etcd directly (no watch cache), so compacting etcd expires old versions."""
    cluster = kube_cluster.start(tmp_path / "k8s", "--watch-cache=false")
    yield cluster
    cluster.stop()


def test_an_informer_follows_changes_and_lists_again_after_410(uncached: kube_cluster.KubeCluster) -> None:
    from kubernetes import client

    core = client.CoreV1Api(uncached.api())
    source = KubeClient(uncached.api())
    pods = Informer("pods", source, pod_of, lambda o: o["metadata"]["name"], lambda: None)
    nodes = Informer("nodes", source, node_of, lambda o: o["metadata"]["name"], lambda: None)
    pods.start()
    nodes.start()
    try:
        wait_for(pods.synced.is_set, 30, "the first list")
        add_node(core, "gpu-a", gpus=4)
        core.create_namespaced_pod("default", pod_body("p1", gpus=1), _preload_content=False)
        wait_for(lambda: "p1" in pods.snapshot()[1], 30, "the watch to see p1")
        assert wait_for(lambda: nodes.snapshot()[1].get("gpu-a"), 30, "the node").spec.gpus[3].index == 3
        core.delete_namespaced_pod("p1", "default", _preload_content=False)
        wait_for(lambda: "p1" not in pods.snapshot()[1], 30, "the watch to see p1 go")
        assert pods.lists == 1, "watched, not listed again"
        since = json_rv(core)
        for name in ("p2", "p3"):  # history past `since`, then compacted away
            core.create_namespaced_pod("default", pod_body(name), _preload_content=False)
        kube_cluster.compact_etcd(uncached)
        events = list(source.watch("pods", since, 5))
        assert events and events[0][0] == "ERROR" and events[0][1]["code"] == 410, events[:1]
        with pytest.raises(Gone):  # which makes the informer's loop list again
            pods._watch(since)
    finally:
        pods.stop()
        nodes.stop()


def json_rv(core: Any) -> str:
    listed = json.loads(core.list_namespaced_pod("default", _preload_content=False).data)
    return str(listed["metadata"]["resourceVersion"])
