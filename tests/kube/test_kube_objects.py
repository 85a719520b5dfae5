"""Kubernetes objects to the scheduler's view, without an apiserver: node inventory, pod requests and the errors
that name their annotation, node constraints, and pods grouped into jobs and gangs."""

from __future__ import annotations

from typing import Any

import pytest

from gpupool.core import PendingKind
from gpupool.devtools.kube_cluster import pod_body
from gpupool.server.kube.constraints import allows
from gpupool.server.kube.objects import Malformed, devices_of, gpu_milli, node_of, pod_of
from gpupool.server.kube.view import Asks, node_entries, pending_jobs


def node(name: str = "n1", gpus: str = "8", labels: dict[str, str] | None = None, ready: str = "True",
         **spec: Any) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": {"nvidia.com/gpu.product": "H100", "nvidia.com/gpu.memory": "81920",
                                                  **(labels or {})}},
            "spec": spec,
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi", "nvidia.com/gpu": gpus},
                       "conditions": [{"type": "Ready", "status": ready}]}}


def pod(name: str, node_name: str = "", namespace: str = "default", **kwargs: Any) -> dict[str, Any]:
    body = pod_body(name, **kwargs)
    body["metadata"].update(namespace=namespace, uid=f"uid-{name}", creationTimestamp="2026-12-06T09:00:00Z")
    if node_name:
        body["spec"]["nodeName"] = node_name
    return body


def test_node_inventory_from_allocatable_and_discovery_labels() -> None:
    found = node_of(node(labels={"topology.kubernetes.io/zone": "z1", "topology.kubernetes.io/rack": "r7"}))
    assert [(g.index, g.model, g.memory_mib) for g in found.spec.gpus][:2] == [(0, "H100", 81920), (1, "H100", 81920)]
    assert len(found.spec.gpus) == 8 and found.spec.cpu_milli == 64000 and found.spec.memory_mib == 512 * 1024
    assert (found.spec.site, found.spec.rack, found.ready) == ("z1", "r7", True)
    assert not node_of(node(unschedulable=True)).ready, "cordoned takes nothing new"
    assert not node_of(node(ready="False")).ready, "NotReady takes nothing new"


@pytest.mark.parametrize(("value", "phrase"), [("abc", "is not a number of GPUs"), ("0.35", "10 % steps"),
                                               ("-1", "between 0 and 64"), ("0", "more than 0"),
                                               ("1.5", "whole number")])
def test_a_malformed_fraction_names_the_annotation(value: str, phrase: str) -> None:
    with pytest.raises(Malformed) as caught:
        gpu_milli(pod_of(pod("p", fraction=value)))
    assert str(caught.value).startswith(f'annotation gpupool.io/gpu: "{value}"') and phrase in str(caught.value)


def test_requests_from_limits_and_the_fraction_annotation() -> None:
    assert gpu_milli(pod_of(pod("p", gpus=2))) == (2, 1000)
    assert gpu_milli(pod_of(pod("p", fraction="0.3"))) == (1, 300)
    assert gpu_milli(pod_of(pod("p"))) == (0, 0)
    parsed = pod_of(pod("p", cpu="500m", memory="2Gi"))
    assert (parsed.cpu_milli, parsed.memory_mib) == (500, 2048)


def test_recorded_devices_are_read_back_and_nonsense_is_ignored() -> None:
    bound = pod_of(pod("p", node_name="n1", annotations={"gpupool.io/gpu-devices": "3:500"}))
    assert [(s.index, s.milli) for s in devices_of(bound, 8) or ()] == [(3, 500)]
    assert devices_of(bound, 2) is None, "a device the node does not have"
    assert devices_of(pod_of(pod("q", annotations={"gpupool.io/gpu-devices": "x"})), 8) is None


def test_selectors_affinity_and_taints() -> None:
    tainted = node_of(node("t", labels={"pool": "a"}, taints=[{"key": "gpu", "value": "yes", "effect": "NoSchedule"}]))
    plain = node_of(node("p", labels={"pool": "b"}))
    tolerant = pod_of(pod("x", tolerations=[{"key": "gpu", "operator": "Exists"}])).asks
    assert allows(tainted, tolerant) and not allows(tainted, {}) and allows(plain, {})
    selector = pod_of(pod("y", nodeSelector={"pool": "b"})).asks
    assert allows(plain, selector) and not allows(tainted, selector)
    term = {"nodeSelectorTerms": [{"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["b"]}]}]}
    affine = pod_of(pod("z", affinity={"nodeAffinity": {
        "requiredDuringSchedulingIgnoredDuringExecution": term}}, tolerations=[{"operator": "Exists"}])).asks
    assert allows(tainted, affine) and not allows(plain, affine)


def test_nodes_get_the_tags_of_the_constraints_they_satisfy_and_lose_other_schedulers_pods() -> None:
    nodes = {n.name: n for n in (node_of(node("a", labels={"pool": "a"})), node_of(node("b", labels={"pool": "b"})))}
    pods = [pod_of(pod("picky", nodeSelector={"pool": "b"})), pod_of(pod("any")),
            pod_of(pod("other", node_name="a", cpu="10", scheduler="default-scheduler"))]
    asks = Asks.of([p for p in pods if not p.node], nodes.values())
    entries = {e.spec.name: e for e in node_entries(nodes, pods, asks)}
    picky, anywhere = asks.tag(pods[0]), asks.tag(pods[1])
    assert entries["b"].spec.labels >= set(picky + anywhere) and not entries["a"].spec.labels >= set(picky)
    assert entries["a"].spec.cpu_milli == 54000, "another scheduler's pod's CPU is not ours to give"


def test_pods_become_jobs_and_a_gang_one_job_waiting_for_its_members() -> None:
    gang = {"labels": {"gpupool.io/pod-group": "g"}, "annotations": {"gpupool.io/min-member": "3"}}
    pods = [pod_of(pod(f"g{i}", gpus=1, **gang)) for i in range(2)] + [pod_of(pod("solo", fraction="0.5")),
                                                                        pod_of(pod("bad", fraction="abc"))]
    out = pending_jobs(pods, {}, Asks(), lambda p: "q")
    assert set(out.jobs) == {"k8s:default/solo"}
    assert out.waiting["k8s:default/g"].kind is PendingKind.GANG_INCOMPLETE
    assert "2 of its 3 members" in out.waiting["k8s:default/g"].message
    assert out.waiting["k8s:default/bad"].kind is PendingKind.INVALID_REQUEST
    resumed = pending_jobs(pods[:2], {("default", "g"): 1}, Asks(), lambda p: "q")
    job = resumed.jobs["k8s:default/g"]
    assert (len(job.tasks), job.min_tasks) == (2, 2), "one member bound before a restart: the others go together"
