"""`make run-k8s`: a local Kubernetes control plane (etcd + kube-apiserver 1.20.2 from scripts/build-kube), 8 FAKE
GPU nodes (API objects, as kwok makes them; a labelled kubelet stand-in moves bound pods to Running), and gpupool
scheduling the cluster's pods; it prints the kubectl lines that submit a fractional pod and a gang and show where
they went, then runs until Ctrl-C. Demo tooling, never part of the product."""

from __future__ import annotations

import argparse
import shutil
import signal
import threading
from pathlib import Path

from gpupool.devtools import kube_cluster
from gpupool.devtools.harness import stop_server
from gpupool.devtools.kubelet_standin import KubeletStandIn

FRACTION = """apiVersion: v1
kind: Pod
metadata: {name: half, annotations: {gpupool.io/gpu: "0.5"}}
spec:
  schedulerName: gpupool
  containers: [{name: main, image: busybox, resources: {limits: {cpu: "1", memory: 1Gi}}}]
"""

GANG = """apiVersion: v1
kind: Pod
metadata: {name: train-N, labels: {gpupool.io/pod-group: train}, annotations: {gpupool.io/min-member: "4"}}
spec:
  schedulerName: gpupool
  containers: [{name: main, image: busybox, resources: {limits: {nvidia.com/gpu: 2, cpu: "8", memory: 32Gi}}}]
"""


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m gpupool.devtools.kube_demo", description=__doc__)
    parser.add_argument("--dir", type=Path, default=Path("k8s-demo"), help="where the cluster and gpupool keep data")
    parser.add_argument("--nodes", type=int, default=8)
    args = parser.parse_args(argv)
    why = kube_cluster.missing()
    if why:
        print(f"error: {why}")
        return 2
    shutil.rmtree(args.dir, ignore_errors=True)
    cluster = kube_cluster.start(args.dir.resolve() / "k8s")
    try:
        return _serve(cluster, args.dir.resolve(), args.nodes)
    finally:
        cluster.stop()


def _serve(cluster: kube_cluster.KubeCluster, root: Path, count: int) -> int:
    from kubernetes import client

    core = client.CoreV1Api(cluster.api())
    for i in range(count):
        kube_cluster.add_node(core, f"gpu-node-{i}", gpus=8 if i % 2 == 0 else 4,
                              labels={"topology.kubernetes.io/zone": f"zone-{i % 2}"})
    bed = kube_cluster.Testbed(cluster, core, root)
    server = bed.start_gpupool(GPUPOOL_CYCLE_INTERVAL_S="0.5")
    (root / "half.yaml").write_text(FRACTION)
    (root / "gang.yaml").write_text(GANG)
    k = f"kubectl --kubeconfig {cluster.kubeconfig}"
    columns = "POD:.metadata.name,NODE:.spec.nodeName,DEVICES:'.metadata.annotations.gpupool\\.io/gpu-devices'"
    print(f"""gpupool schedules this cluster's pods: {count} FAKE GPU nodes (no real GPUs; a kubelet stand-in marks
bound pods Running). gpupool's API: {server.url} (admin token in {root / 'gpupool' / 'admin.token'}).

  {k} get nodes
  {k} apply -f {root / 'half.yaml'}                       # half a GPU
  for i in 0 1 2 3; do sed "s/train-N/train-$i/" {root / 'gang.yaml'} | {k} apply -f -; done   # a 4-pod gang
  {k} get pods -o custom-columns={columns}
  {k} get events                                          # FailedScheduling, with gpupool's reason

Ctrl-C stops everything.""", flush=True)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    try:
        with KubeletStandIn(core):
            done.wait()
    except KeyboardInterrupt:
        pass
    finally:
        stop_server(server)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
