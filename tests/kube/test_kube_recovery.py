"""The apiserver is the truth for placements: a scheduler killed with -9 in the middle of a burst and restarted
binds every pod once, with no device booked twice; a deleted node's pods are freed (deleted, for their controller to
create again) and a node of that name that comes back is empty."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from gpupool.devtools.harness import kill_server, restart_server, wait_for
from gpupool.devtools.kube_cluster import Testbed as Kube
from gpupool.devtools.kube_cluster import add_node, pod_body


def bound(pods: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {n: p for n, p in pods.items() if p["spec"].get("nodeName")}


def booked(pods: dict[str, dict[str, Any]]) -> Counter[tuple[str, int]]:
    """Milli-GPU booked per (node, device), read back from the pods' device annotations."""
    use: Counter[tuple[str, int]] = Counter()
    for p in bound(pods).values():
        for item in p["metadata"]["annotations"]["gpupool.io/gpu-devices"].split(","):
            index, milli = item.split(":")
            use[(p["spec"]["nodeName"], int(index))] += int(milli)
    return use


def test_kill_9_during_a_burst_of_500_pods_then_restart_binds_each_exactly_once(kube: Kube) -> None:
    for i in range(64):
        add_node(kube.core, f"node-{i:02d}", gpus=8)
    server = kube.start_gpupool()
    total = 500
    creator = threading.Thread(target=lambda: [kube.create_pod(pod_body(f"burst-{i:03d}", gpus=1, cpu="100m"))
                                               for i in range(total)])
    creator.start()
    wait_for(lambda: len(bound(kube.pods())) >= 40, 120, "the burst to start binding", step_s=0.05)
    assert kill_server(server) == -9
    at_kill = bound(kube.pods())
    creator.join()
    assert len(at_kill) < total, "killed during the burst"
    server = kube.server = restart_server(server)  # the fixture stops the one that runs
    pods = wait_for(lambda: (p := kube.pods()) and len(bound(p)) == total and p, 180, "every pod bound", step_s=0.5)
    for name, pod in at_kill.items():
        assert pods[name]["spec"]["nodeName"] == pod["spec"]["nodeName"], f"{name} was bound once and stays"
    use = booked(pods)
    assert sum(use.values()) == total * 1000
    assert max(use.values()) == 1000, f"0 devices double-booked: {[k for k, v in use.items() if v > 1000]}"


def test_a_deleted_nodes_pods_are_freed_and_the_node_comes_back_empty(kube: Kube) -> None:
    add_node(kube.core, "gpu-a", gpus=2)
    add_node(kube.core, "gpu-b", gpus=2)
    kube.start_gpupool()
    kube.create_pod(pod_body("first", gpus=2))
    gone_from = kube.wait_bound(["first"])["first"]["spec"]["nodeName"]
    other = ({"gpu-a", "gpu-b"} - {gone_from}).pop()
    kube.core.delete_node(gone_from, _preload_content=False)
    wait_for(lambda: "first" not in kube.pods(), 30, "the orphaned pod deleted (for its controller to recreate)")
    kube.create_pod(pod_body("first-again", gpus=2))  # what its controller does
    assert kube.wait_bound(["first-again"])["first-again"]["spec"]["nodeName"] == other
    add_node(kube.core, gone_from, gpus=2)
    kube.create_pod(pod_body("second", gpus=2))
    assert kube.wait_bound(["second"])["second"]["spec"]["nodeName"] == gone_from, "its old pod's GPUs were freed"
