"""The informers keep up with the apiserver: list, then watch from the list's resourceVersion; a version the
apiserver no longer has answers 410 Gone, and the informer lists again."""

from __future__ import annotations

import pytest

from gpupool.devtools.harness import wait_for
from gpupool.devtools.kube_cluster import Testbed as Kube
from gpupool.devtools.kube_cluster import add_node, pod_body
from gpupool.server.kube.client import KubeClient
from gpupool.server.kube.informer import Gone, Informer
from gpupool.server.kube.objects import node_of, pod_of


def test_an_informer_follows_changes_and_lists_again_after_410(kube: Kube) -> None:
    source = KubeClient(kube.cluster.api())
    changes: list[int] = []
    pods = Informer("pods", source, pod_of, lambda o: o["metadata"]["name"], lambda: changes.append(1))
    nodes = Informer("nodes", source, node_of, lambda o: o["metadata"]["name"], lambda: None)
    pods.start()
    nodes.start()
    try:
        wait_for(pods.synced.is_set, 30, "the first list")
        add_node(kube.core, "gpu-a", gpus=4)
        kube.create_pod(pod_body("p1", gpus=1))
        wait_for(lambda: "p1" in pods.snapshot()[1], 30, "the watch to see p1")
        assert wait_for(lambda: nodes.snapshot()[1].get("gpu-a"), 30, "the node").spec.gpus[3].index == 3
        kube.core.delete_namespaced_pod("p1", "default", _preload_content=False)
        wait_for(lambda: "p1" not in pods.snapshot()[1], 30, "the watch to see p1 go")
        assert pods.lists == 1, "watched, not listed again"
        for i in range(150):  # more changes than the apiserver's watch cache keeps for pods
            kube.create_pod(pod_body(f"churn-{i}"))
        with pytest.raises(Gone):
            pods._watch("2")
    finally:
        pods.stop()
        nodes.stop()
