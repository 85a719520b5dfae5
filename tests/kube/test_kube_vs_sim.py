"""One core, one profile: the same nodes and pods give the same placements through the Kubernetes backend (a real
apiserver, pods submitted one at a time) as through the simulator (the fill protocol's one-job cycles on a
SimCluster)."""

from __future__ import annotations

import json
import random

from gpupool.core import (
    Bind,
    FixedClock,
    Framework,
    JobSpec,
    TaskSpec,
    Workload,
    default_registry,
    run_cycle,
    scheduling_profile,
)
from gpupool.devtools.kube_cluster import Testbed as Kube
from gpupool.devtools.kube_cluster import add_node, pod_body
from gpupool.server.kube.objects import node_of, pod_of, shape_of
from gpupool.server.scheduler.loop import GENERIC_SHAPES
from gpupool.sim.cluster import SimCluster

#: (name, whole GPUs, fraction, CPU): an openb-like mix of fractions and whole GPUs
TRACE = [("p00", 0, "0.5", "4"), ("p01", 2, None, "16"), ("p02", 0, "0.3", "2"), ("p03", 1, None, "8"),
         ("p04", 0, "0.5", "4"), ("p05", 4, None, "32"), ("p06", 0, "0.2", "2"), ("p07", 1, None, "8"),
         ("p08", 0, "0.7", "6"), ("p09", 2, None, "16"), ("p10", 0, "0.4", "4"), ("p11", 1, None, "12")]
NODES = [("a", 8, "96"), ("b", 4, "48"), ("c", 2, "32")]


def simulated(kube_nodes: list[dict], pods: list[dict]) -> list[tuple[str, str]]:
    nodes = sorted((node_of(n).spec for n in kube_nodes), key=lambda s: s.name)
    cluster = SimCluster(nodes)
    profile = scheduling_profile("default", "best").with_workload(Workload.from_shapes(GENERIC_SHAPES))
    framework, rng = Framework.build(profile, default_registry()), random.Random(0)
    placed = []
    for obj in pods:
        pod = pod_of(obj)
        job = JobSpec(f"k8s:{pod.key}", (TaskSpec(f"k8s:{pod.uid}", shape_of(pod)),), "default:default")
        result = run_cycle(cluster.snapshot((job,), 0.0), framework, clock=FixedClock(), rng=rng)
        cluster.apply(list(result.decisions))
        binds = [d for d in result.decisions if isinstance(d, Bind)]
        placed.append((binds[0].node, ",".join(f"{s.index}:{s.milli}" for s in binds[0].shares)) if binds else ("", ""))
    return placed


def test_the_same_trace_places_the_same_through_kubernetes_and_the_simulator(kube: Kube) -> None:
    for name, gpus, cpu in NODES:
        add_node(kube.core, name, gpus=gpus, cpu=cpu, memory="256Gi")
    kube.start_gpupool()
    for name, gpus, fraction, cpu in TRACE:
        kube.create_pod(pod_body(name, gpus=gpus, fraction=fraction, cpu=cpu))
        kube.wait_bound([name])
    live = kube.pods()
    through_kube = [(live[n]["spec"]["nodeName"], live[n]["metadata"]["annotations"]["gpupool.io/gpu-devices"])
                    for n, *_ in TRACE]
    kube_nodes = json.loads(kube.core.list_node(_preload_content=False).data)["items"]
    assert through_kube == simulated(kube_nodes, [live[n] for n, *_ in TRACE])
