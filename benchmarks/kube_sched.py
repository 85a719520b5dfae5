"""gpupool and kube-scheduler side by side on one real kube-apiserver 1.20.2 (both built from Debian's source tree
by scripts/build-kube), fake nodes as API objects, each scheduler on a fresh cluster:

1. throughput: NODES nodes x 8 GPUs, PODS whole-GPU pods created before the scheduler starts; pods bound per second
   from the scheduler being ready to the last pod bound (its informers' first list included, for both);
2. allocation: openb-shaped pods (openb_pod_list_default, GPU model constraints dropped, as every node is one
   model) drawn up to 130 % of the GPU capacity (the fill protocol's `tune`, seed 42), fractions rounded to the
   annotation's 10 % steps, created in that order;
   the GPU the bound pods asked for, as a share of capacity, once each scheduler is done. kube-scheduler cannot share
   a GPU, so it gets each fraction rounded up to one whole GPU (what it books), and is credited with the fraction
   (what the pod uses). The simulator's `best` (one-pod fill cycles on a SimCluster, the control plane's profile)
   places the same pods on the same nodes, as the reference.
"""

from __future__ import annotations

import json
import random
import subprocess
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from fractions import Fraction
from pathlib import Path
from typing import Any

from gpupool.core import (
    Bind,
    FixedClock,
    Framework,
    JobSpec,
    TaskShape,
    TaskSpec,
    Workload,
    default_registry,
    run_cycle,
    scheduling_profile,
)
from gpupool.devtools import kube_cluster
from gpupool.devtools.harness import free_port, stop_server, wait_for
from gpupool.server.kube.objects import node_of
from gpupool.server.scheduler.loop import GENERIC_SHAPES
from gpupool.sim.cluster import SimCluster
from gpupool.sim.fill import tune
from gpupool.sim.traces.openb import read_pods

GPUS, CPU, MEMORY = 8, "96", "384Gi"


def _bound(core: Any) -> int:
    pods = json.loads(core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=", _preload_content=False).data)
    return len(pods["items"])


def _cluster(root: Path, nodes: int) -> tuple[kube_cluster.KubeCluster, Any]:
    from kubernetes import client

    cluster = kube_cluster.start(root)
    core = client.CoreV1Api(cluster.api())
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda i: kube_cluster.add_node(core, f"node-{i:04d}", gpus=GPUS, cpu=CPU, memory=MEMORY),
                      range(nodes)))
    return cluster, core


def _create(core: Any, bodies: list[dict[str, Any]]) -> None:
    """Create the pods in order (16 at a time: their creation order is kept to within 16)."""
    with ThreadPoolExecutor(16) as pool:
        list(pool.map(lambda b: core.create_namespaced_pod("default", b, _preload_content=False), bodies))


def _start(kind: str, cluster: kube_cluster.KubeCluster, root: Path) -> tuple[Any, float]:
    """Start the scheduler; (what stop() takes, when it was ready)."""
    if kind == "gpupool":
        bed = kube_cluster.Testbed(cluster, None, root)
        return bed.start_gpupool(GPUPOOL_CYCLE_INTERVAL_S="0.2"), time.monotonic()
    port = free_port()
    log = open(root / "kube-scheduler.log", "ab")  # noqa: SIM115 - closed with the process
    binary = kube_cluster.binaries_dir() / "kube-scheduler"
    process = subprocess.Popen([str(binary), f"--kubeconfig={cluster.kubeconfig}", "--leader-elect=false",
                                f"--secure-port={port}", "--port=0",
                                f"--authentication-kubeconfig={cluster.kubeconfig}",
                                f"--authorization-kubeconfig={cluster.kubeconfig}", "--kube-api-qps=500",
                                "--kube-api-burst=1000"], stdout=log, stderr=subprocess.STDOUT)
    import httpx

    wait_for(lambda: _healthy(httpx, port), 120, "kube-scheduler /healthz", step_s=0.1)
    return process, time.monotonic()


def _healthy(httpx: Any, port: int) -> bool:
    try:
        return httpx.get(f"https://127.0.0.1:{port}/healthz", verify=False, timeout=1).text == "ok"
    except httpx.HTTPError:
        return False


def _stop(kind: str, handle: Any) -> None:
    if kind == "gpupool":
        stop_server(handle)
    else:
        handle.terminate()
        handle.wait(timeout=30)


def throughput(kind: str, nodes: int, pods: int, root: Path) -> float:
    """Pods bound per second by `kind` ("gpupool" or "kube-scheduler")."""
    cluster, core = _cluster(root / "k8s", nodes)
    try:
        scheduler = "gpupool" if kind == "gpupool" else "default-scheduler"
        _create(core, [kube_cluster.pod_body(f"p-{i:05d}", gpus=1, cpu="1", memory="1Gi", scheduler=scheduler)
                       for i in range(pods)])
        handle, ready = _start(kind, cluster, root)
        try:
            wait_for(lambda: _bound(core) >= pods, 1800, f"{kind}: every pod bound", step_s=0.5)
            return pods / (time.monotonic() - ready)
        finally:
            _stop(kind, handle)
    finally:
        cluster.stop()


def openb_shapes(openb: Path, nodes: int) -> list[tuple[str, TaskShape]]:
    """The pods, in creation order; a fraction is rounded to the nearest 10 % step (at least 10 %), as the
    `gpupool.io/gpu` annotation carries it, so that every scheduler and the simulator place the same pods."""
    pods = read_pods(openb / "openb_pod_list_default.csv")
    order = tune(pods, nodes * GPUS * 1000, Fraction(13, 10), random.Random(42))
    return [(f"o-{i:05d}", TaskShape(p.shape.cpu_milli, p.shape.memory_mib, p.shape.gpu_count, _step(p.shape)))
            for i, (_, p) in enumerate(order)]


def _step(shape: TaskShape) -> int:
    return max(100, (shape.gpu_milli + 50) // 100 * 100) if shape.is_shared else shape.gpu_milli


def _openb_body(name: str, shape: TaskShape, whole: bool) -> dict[str, Any]:
    """gpupool gets fractions as the annotation; kube-scheduler whole GPUs (a fraction rounded up)."""
    cpu, memory = f"{shape.cpu_milli}m", f"{max(1, shape.memory_mib)}Mi"
    if whole:
        return kube_cluster.pod_body(name, gpus=shape.gpu_count, cpu=cpu, memory=memory, scheduler="default-scheduler")
    fraction = f"{shape.gpu_milli // 100 / 10}" if shape.is_shared else None
    return kube_cluster.pod_body(name, gpus=0 if shape.is_shared else shape.gpu_count, fraction=fraction, cpu=cpu,
                                 memory=memory)


def allocation(kind: str, nodes: int, shapes: list[tuple[str, TaskShape]], root: Path) -> float:
    """The GPU (milli) the bound pods ask, over the capacity, once `kind` binds nothing more."""
    cluster, core = _cluster(root / "k8s", nodes)
    try:
        _create(core, [_openb_body(n, s, kind != "gpupool") for n, s in shapes])
        handle, _ = _start(kind, cluster, root)
        try:
            last, still = -1, 0
            while still < 3:  # three polls in a row with no new binding: done
                time.sleep(2)
                count = _bound(core)
                still, last = (still + 1, last) if count == last else (0, count)
        finally:
            _stop(kind, handle)
        pods = json.loads(core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=",
                                                           _preload_content=False).data)["items"]
        asked = dict(shapes)
        return sum(asked[p["metadata"]["name"]].total_gpu_milli for p in pods) / (nodes * GPUS * 1000)
    finally:
        cluster.stop()


def simulated(nodes: int, shapes: list[tuple[str, TaskShape]]) -> float:
    """The simulator's `best`: one pod per cycle, in order, the control plane's profile."""
    spec = node_of({"metadata": {"name": "x", "labels": {}}, "status": {"allocatable": {
        "cpu": CPU, "memory": MEMORY, "nvidia.com/gpu": str(GPUS)}}}).spec
    from dataclasses import replace

    cluster = SimCluster([replace(spec, name=f"node-{i:04d}") for i in range(nodes)])
    profile = scheduling_profile("default", "best").with_workload(Workload.from_shapes(GENERIC_SHAPES))
    framework, rng = Framework.build(profile, default_registry()), random.Random(0)
    placed = 0
    for name, shape in shapes:
        job = JobSpec(name, (TaskSpec(name, shape),), "default:default")
        result = run_cycle(cluster.snapshot((job,), 0.0), framework, clock=FixedClock(), rng=rng)
        cluster.apply(list(result.decisions))
        placed += shape.total_gpu_milli * any(isinstance(d, Bind) for d in result.decisions)
    return placed / (nodes * GPUS * 1000)


def run(openb: Path, nodes: int = 1000, pods: int = 5000) -> None:
    why = kube_cluster.missing()
    if why or not (kube_cluster.binaries_dir() / "kube-scheduler").exists():
        print(f"k8s: skipped: {why or 'kube-scheduler missing: run scripts/build-kube'}")
        return
    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="gpupool-bench-k8s-") as tmp:
        rates = {k: throughput(k, nodes, pods, Path(tmp) / f"t-{k}") for k in ("kube-scheduler", "gpupool")}
        shapes = openb_shapes(openb, nodes)
        shares = {k: allocation(k, nodes, shapes, Path(tmp) / f"a-{k}") for k in ("kube-scheduler", "gpupool")}
    best = simulated(nodes, shapes)
    print(f"k8s throughput, {nodes} nodes x {GPUS} GPUs, {pods} whole-GPU pods (pods bound per second):")
    for kind, rate in rates.items():
        print(f"  {kind:15s} {rate:8.1f} /s")
    print(f"  gpupool / kube-scheduler: {rates['gpupool'] / rates['kube-scheduler']:.2f}x")
    print(f"k8s allocation, {len(shapes)} openb-shaped pods up to 130 % of {nodes * GPUS} GPUs "
          "(GPU asked by bound pods):")
    for kind, share in [*shares.items(), ("simulator best", best)]:
        print(f"  {kind:15s} {100 * share:6.2f} %")
    print(f"  gpupool - simulator best: {100 * (shares['gpupool'] - best):+.2f} points")
    print(f"k8s suite: {time.monotonic() - started:.0f} s")
