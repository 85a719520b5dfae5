"""gpupool schedules Kubernetes pods on a real kube-apiserver (issue 34's "done when", end to end): fractions share
a GPU, gangs bind all or nothing, a pod that fits nowhere or asks nonsense says why on its PodScheduled condition
and in an Event, and queues and fair share hold across namespaces."""

from __future__ import annotations

from gpupool.devtools.harness import wait_for
from gpupool.devtools.kube_cluster import Testbed as Kube
from gpupool.devtools.kube_cluster import add_node, pod_body


def devices(pod: dict) -> str:
    return pod["metadata"]["annotations"]["gpupool.io/gpu-devices"]


def test_two_half_gpu_pods_share_one_gpu_on_the_node_and_device_the_core_chose(kube: Kube) -> None:
    add_node(kube.core, "gpu-a", gpus=2)
    add_node(kube.core, "gpu-b", gpus=1)
    server = kube.start_gpupool()
    kube.create_pod(pod_body("half-1", fraction="0.5"))
    kube.create_pod(pod_body("half-2", fraction="0.5"))
    pods = kube.wait_bound(["half-1", "half-2"])
    nodes = {p["spec"]["nodeName"] for p in pods.values()}
    assert len(nodes) == 1, f"both halves on one node, got {nodes}"
    assert devices(pods["half-1"]) == devices(pods["half-2"]), "on one GPU"
    assert devices(pods["half-1"]).endswith(":500")
    # best-fit packs fractions onto the smallest node that takes them: the 1-GPU node
    assert nodes == {"gpu-b"}
    with server.client() as api:  # `gpupool nodes` shows the Kubernetes nodes, their GPUs as gpupool booked them
        shown = {n["name"]: n for n in api.get("/nodes").json()}
    assert shown["gpu-b"]["jobs_as"] == "kubernetes" and shown["gpu-b"]["gpus"][0]["allocated_milli"] == 1000
    assert [g["allocated_milli"] for g in shown["gpu-a"]["gpus"]] == [0, 0]
    wait_for(lambda: all(p["status"].get("phase") == "Running" for p in kube.pods().values()), 30,
             "the kubelet stand-in to mark them Running")


def test_a_gang_binds_all_or_nothing(kube: Kube) -> None:
    for name in ("gpu-a", "gpu-b", "gpu-c"):
        add_node(kube.core, name, gpus=2)
    kube.start_gpupool()
    gang = {"gpupool.io/pod-group": "train"}
    for i in range(4):
        kube.create_pod(pod_body(f"train-{i}", gpus=2, labels=gang, annotations={"gpupool.io/min-member": "4"}))
    message = wait_for(lambda: "no_node_fits" in (m := (kube.condition("train-0") or {}).get("message", "")) and m,
                       30, "the gang's reason")
    assert message.startswith("gpupool: no_node_fits: "), message
    assert not any(p["spec"].get("nodeName") for p in kube.pods().values()), "3 of 4 places: none bound"
    add_node(kube.core, "gpu-d", gpus=2)
    pods = kube.wait_bound([f"train-{i}" for i in range(4)])
    assert len({p["spec"]["nodeName"] for p in pods.values()}) == 4


def test_a_gang_waits_for_its_members(kube: Kube) -> None:
    add_node(kube.core, "gpu-a", gpus=8)
    kube.start_gpupool()
    gang = {"gpupool.io/pod-group": "mpi"}
    for i in range(3):
        kube.create_pod(pod_body(f"mpi-{i}", gpus=1, labels=gang, annotations={"gpupool.io/min-member": "4"}))
    message = wait_for(lambda: "3 of" in (m := (kube.condition("mpi-0") or {}).get("message", "")) and m, 30,
                       "the gang's reason")
    assert "gang_incomplete: pod group mpi: 3 of its 4 members exist" in message, message
    assert not any(p["spec"].get("nodeName") for p in kube.pods().values())
    kube.create_pod(pod_body("mpi-3", gpus=1, labels=gang, annotations={"gpupool.io/min-member": "4"}))
    kube.wait_bound([f"mpi-{i}" for i in range(4)])


def test_a_pod_that_fits_nowhere_says_why_and_gets_an_event(kube: Kube) -> None:
    add_node(kube.core, "gpu-a", gpus=8)
    kube.start_gpupool()
    kube.create_pod(pod_body("huge", gpus=16))
    condition = wait_for(lambda: kube.condition("huge"), 30, "PodScheduled condition")
    assert condition["status"] == "False" and condition["reason"] == "Unschedulable"
    assert "too few GPUs on node" in condition["message"], condition
    events = wait_for(lambda: kube.events("huge"), 30, "a FailedScheduling event")
    assert events[0]["reason"] == "FailedScheduling" and events[0]["type"] == "Warning"
    assert events[0]["source"]["component"] == "gpupool"


def test_malformed_annotations_leave_the_pod_pending_with_a_reason_naming_the_annotation(kube: Kube) -> None:
    add_node(kube.core, "gpu-a", gpus=8)
    kube.start_gpupool()
    bad = {"abc": "abc", "frac": "0.35", "neg": "-1"}
    for name, value in bad.items():
        kube.create_pod(pod_body(f"bad-{name}", fraction=value))
    for name, value in bad.items():
        condition = wait_for(lambda n=name: kube.condition(f"bad-{n}"), 30, f"bad-{name}'s reason")
        assert condition["reason"] == "Unschedulable"
        assert "annotation gpupool.io/gpu" in condition["message"] and value in condition["message"], condition
        assert "{'" not in condition["message"] and "Traceback" not in condition["message"]
    assert "10 % steps" in kube.condition("bad-frac")["message"]
    kube.create_pod(pod_body("good", fraction="0.5"))
    kube.wait_bound(["good"])  # nothing crashed: the scheduler goes on
    assert not any(p["spec"].get("nodeName") for n, p in kube.pods().items() if n.startswith("bad-"))


def test_queue_limits_hold_across_two_namespaces(kube: Kube) -> None:
    add_node(kube.core, "gpu-a", gpus=8)
    server = kube.start_gpupool()
    with server.client() as api:
        for name in ("team-a", "team-b"):
            assert api.post("/queues", json={"name": name, "limit": {"gpus": "2"}}).status_code == 201, name
            kube.namespace(name)
    for ns in ("team-a", "team-b"):
        for i in range(3):
            kube.create_pod(pod_body(f"w-{i}", gpus=1), namespace=ns)
    for ns in ("team-a", "team-b"):
        wait_for(lambda n=ns: sum(1 for p in kube.pods(n).values() if p["spec"].get("nodeName")) == 2, 30,
                 f"two pods of {ns} bound")
    wait_for(lambda: kube.condition("w-2", "team-a"), 30, "the third pod's reason")
    for ns in ("team-a", "team-b"):
        bound = [p for p in kube.pods(ns).values() if p["spec"].get("nodeName")]
        assert len(bound) == 2, f"{ns}: its queue's limit of 2 GPUs holds, got {len(bound)}"
        waiting = [p["metadata"]["name"] for p in kube.pods(ns).values() if not p["spec"].get("nodeName")]
        condition = wait_for(lambda n=ns, w=waiting[0]: kube.condition(w, n), 30, f"{ns}: the waiting pod's reason")
        assert "over_quota" in condition["message"], condition


def test_preemption_evicts_a_lower_priority_pod_through_the_eviction_api(kube: Kube) -> None:
    add_node(kube.core, "gpu-a", gpus=2)
    from kubernetes import client

    for name, value in (("low", 0), ("high", 1000)):
        client.SchedulingV1Api(kube.core.api_client).create_priority_class(
            {"apiVersion": "scheduling.k8s.io/v1", "kind": "PriorityClass", "metadata": {"name": name}, "value": value},
            _preload_content=False)
    kube.start_gpupool(GPUPOOL_PROFILE="fair-share")
    for i in range(2):
        kube.create_pod(pod_body(f"low-{i}", gpus=1, priorityClassName="low"))
    kube.wait_bound(["low-0", "low-1"])
    kube.create_pod(pod_body("urgent", gpus=1, priorityClassName="high"))
    assert kube.wait_bound(["urgent"])["urgent"]["spec"]["nodeName"] == "gpu-a"
    left = [n for n in kube.pods() if n.startswith("low-")]
    assert len(left) == 1, f"one low-priority pod evicted (and stopped by its kubelet), left: {left}"
    events = [e for n in ("low-0", "low-1") for e in kube.events(n)]
    assert not [e for e in events if e["reason"] == "FailedScheduling"]


def test_fair_share_reclaims_borrowed_gpus_across_two_namespaces(kube: Kube) -> None:
    """team-a borrows the whole node while team-b is idle; when team-b asks for its guarantee, fair-share evicts
    team-a's borrowed pods through the Eviction API until each namespace holds its share."""
    add_node(kube.core, "gpu-a", gpus=8)
    server = kube.start_gpupool(GPUPOOL_PROFILE="fair-share")
    with server.client() as api:
        for name in ("team-a", "team-b"):
            created = api.post("/queues", json={"name": name, "guaranteed": {"gpus": "4"}})
            assert created.status_code == 201, created.text
            kube.namespace(name)

    def bound(ns: str) -> int:
        return sum(1 for p in kube.pods(ns).values() if p["spec"].get("nodeName"))

    for i in range(8):
        kube.create_pod(pod_body(f"a-{i}", gpus=1), namespace="team-a")
    wait_for(lambda: bound("team-a") == 8, 30, "team-a borrows all 8 GPUs while team-b is idle")
    for i in range(4):
        kube.create_pod(pod_body(f"b-{i}", gpus=1), namespace="team-b")
    wait_for(lambda: bound("team-b") == 4, 60, "team-b gets its guarantee back by reclaim")
    wait_for(lambda: len(kube.pods("team-a")) == 4, 30, "team-a's evicted pods are gone")
    assert bound("team-a") == 4, "team-a keeps its own guarantee"
    evicted = {n for n in (f"a-{i}" for i in range(8)) if n not in kube.pods("team-a")}
    assert len(evicted) == 4, evicted
    booked = [p["metadata"]["annotations"]["gpupool.io/gpu-devices"] for ns in ("team-a", "team-b")
              for p in kube.pods(ns).values()]
    assert len(set(booked)) == 8, f"8 pods on 8 distinct GPUs, got {booked}"
