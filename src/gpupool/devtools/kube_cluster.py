"""A real Kubernetes control plane for tests, the `make run-k8s` demo and the k8s benchmark: Debian's etcd-server
and a kube-apiserver 1.20.2 built from Debian's source package by scripts/build-kube, on free loopback ports, token
authentication. Nodes are API objects (as kwok makes them); no kubelet runs (see kubelet_standin). Never used by
the product itself."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from gpupool.devtools.harness import Server, free_port, start_server, wait_for

VERSION = "1.20.2"
TOKEN = "gpupool-test-token"
REPO = Path(__file__).resolve().parents[3]


def binaries_dir() -> Path:
    """Where scripts/build-kube caches the binaries ($GPUPOOL_K8S_CACHE/1.20.2, default ~/.cache/gpupool/k8s)."""
    root = os.environ.get("GPUPOOL_K8S_CACHE") or str(Path.home() / ".cache" / "gpupool" / "k8s")
    return Path(root) / VERSION


def missing() -> str:
    """Why the cluster cannot start here ("" when it can)."""
    if shutil.which("etcd") is None:
        return "etcd is not installed (scripts/build-kube installs etcd-server)"
    for name in ("kube-apiserver",):
        if not os.access(binaries_dir() / name, os.X_OK):
            return f"{binaries_dir() / name} is missing: run scripts/build-kube (about 4 minutes)"
    return ""


@dataclass
class KubeCluster:
    root: Path
    port: int = 0
    etcd_port: int = 0
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    @property
    def kubeconfig(self) -> Path:
        return self.root / "kubeconfig"

    def api(self) -> Any:
        """An official-client ApiClient on this cluster."""
        from gpupool.server.kube.client import load

        return load(str(self.kubeconfig))

    def stop(self) -> None:
        for process in reversed(self.processes):
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
                try:
                    process.wait(timeout=15)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()
        self.processes.clear()


def start(root: Path, *apiserver_args: str) -> KubeCluster:
    """etcd and kube-apiserver (with `apiserver_args` added) under `root` (their data, logs, keys and a kubeconfig),
    ready to serve."""
    root.mkdir(parents=True, exist_ok=True)
    cluster = KubeCluster(root)
    try:
        etcd = _etcd(root)
        cluster.processes.append(etcd[0])
        cluster.port, cluster.etcd_port = free_port(), etcd[1]
        cluster.processes.append(_apiserver(root, etcd[1], cluster.port, apiserver_args))
        _kubeconfig(cluster)
        wait_for(lambda: _ready(cluster), 90, "kube-apiserver /readyz", step_s=0.3)
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _etcd(root: Path) -> tuple[subprocess.Popen[bytes], int]:
    client, peer, metrics = free_port(), free_port(), free_port()
    cmd = ["etcd", "--name", "gp", "--data-dir", str(root / "etcd"),
           "--listen-client-urls", f"http://127.0.0.1:{client}", "--advertise-client-urls", f"http://127.0.0.1:{client}",
           "--listen-peer-urls", f"http://127.0.0.1:{peer}", "--initial-advertise-peer-urls", f"http://127.0.0.1:{peer}",
           "--initial-cluster", f"gp=http://127.0.0.1:{peer}", "--listen-metrics-urls", f"http://127.0.0.1:{metrics}",
           "--unsafe-no-fsync"]
    with open(root / "etcd.log", "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT), client


def _apiserver(root: Path, etcd_port: int, port: int, extra: tuple[str, ...]) -> subprocess.Popen[bytes]:
    if not (root / "sa.key").exists():
        subprocess.run(["openssl", "genrsa", "-out", str(root / "sa.key"), "2048"], check=True, capture_output=True)
        subprocess.run(["openssl", "rsa", "-in", str(root / "sa.key"), "-pubout", "-out", str(root / "sa.pub")],
                       check=True, capture_output=True)
    (root / "tokens.csv").write_text(f"{TOKEN},admin,1,system:masters\n")
    cmd = [str(binaries_dir() / "kube-apiserver"), f"--etcd-servers=http://127.0.0.1:{etcd_port}",
           "--bind-address=127.0.0.1", "--advertise-address=127.0.0.1", f"--secure-port={port}",
           f"--cert-dir={root / 'certs'}", f"--token-auth-file={root / 'tokens.csv'}", "--authorization-mode=RBAC",
           "--service-account-issuer=https://kubernetes.default.svc", f"--service-account-key-file={root / 'sa.pub'}",
           f"--service-account-signing-key-file={root / 'sa.key'}", "--service-cluster-ip-range=10.96.0.0/24",
           "--disable-admission-plugins=ServiceAccount", "--insecure-port=0", "--max-requests-inflight=2000",
           "--max-mutating-requests-inflight=1000", *extra]
    with open(root / "apiserver.log", "ab") as log:
        return subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT)


def compact_etcd(cluster: KubeCluster) -> int:
    """Compact etcd's history up to its current revision (what the apiserver does every 5 minutes): a watch from an
    older resourceVersion then gets 410 Gone. Returns the revision."""
    url = f"http://127.0.0.1:{cluster.etcd_port}/v3"
    revision = int(httpx.post(f"{url}/kv/range", json={"key": "AA=="}, timeout=10).json()["header"]["revision"])
    httpx.post(f"{url}/kv/compaction", json={"revision": revision, "physical": True}, timeout=30).raise_for_status()
    return revision


def _kubeconfig(cluster: KubeCluster) -> None:
    cluster.kubeconfig.write_text(f"""apiVersion: v1
kind: Config
clusters:
- name: gpupool-test
  cluster: {{server: "{cluster.url}", insecure-skip-tls-verify: true}}
users:
- name: admin
  user: {{token: {TOKEN}}}
contexts:
- name: gpupool-test
  context: {{cluster: gpupool-test, user: admin}}
current-context: gpupool-test
""")


def _ready(cluster: KubeCluster) -> bool:
    for process in cluster.processes:
        if process.poll() is not None:
            logs = "".join((cluster.root / n).read_text(errors="replace")[-1500:]
                           for n in ("etcd.log", "apiserver.log"))
            raise RuntimeError(f"a Kubernetes process exited {process.returncode}: {logs}")
    try:
        answer = httpx.get(f"{cluster.url}/readyz", headers={"Authorization": f"Bearer {TOKEN}"}, verify=False,
                           timeout=2)
    except httpx.HTTPError:
        return False
    return answer.status_code == 200 and answer.text.strip() == "ok"


# Fake GPU nodes and gpupool pods, as API objects ----------------------------------------------------------------


def add_node(core: Any, name: str, gpus: int = 8, model: str = "NVIDIA-H100-80GB-HBM3", gpu_memory_mib: int = 81559,
             cpu: str = "128", memory: str = "1024Gi", labels: dict[str, str] | None = None,
             taints: list[dict[str, str]] | None = None, ready: bool = True) -> None:
    """A Node with `gpus` allocatable nvidia.com/gpu and GPU feature discovery's labels, Ready (its status set
    through the status subresource, as a kubelet would; no kubelet runs)."""
    body = {"apiVersion": "v1", "kind": "Node",
            "metadata": {"name": name, "labels": {"nvidia.com/gpu.product": model,
                                                  "nvidia.com/gpu.memory": str(gpu_memory_mib),
                                                  "gpupool.io/fake-node": "true", **(labels or {})}},
            "spec": {"taints": taints or []}}
    core.create_node(body, _preload_content=False)
    resources = {"cpu": cpu, "memory": memory, "nvidia.com/gpu": str(gpus), "pods": "1000"}
    status = {"status": {"capacity": resources, "allocatable": resources, "conditions": [
        {"type": "Ready", "status": "True" if ready else "False", "reason": "FakeNode",
         "message": "a fake GPU node (no kubelet: gpupool test tooling)"}]}}
    core.patch_node_status(name, status, _preload_content=False)
    if ready:  # the apiserver taints a new node not-ready; the node lifecycle controller (not running) would lift it
        core.patch_node(name, {"spec": {"taints": taints or None}}, _preload_content=False)


def pod_body(name: str, gpus: int = 0, fraction: str | None = None, cpu: str = "1", memory: str = "1Gi",
             labels: dict[str, str] | None = None, annotations: dict[str, str] | None = None,
             scheduler: str = "gpupool", **spec: Any) -> dict[str, Any]:
    """A pod for gpupool: `gpus` whole GPUs as nvidia.com/gpu limits, or a `fraction` annotation."""
    limits: dict[str, str] = {"cpu": cpu, "memory": memory}
    if gpus:
        limits["nvidia.com/gpu"] = str(gpus)
    notes = dict(annotations or {})
    if fraction is not None:
        notes["gpupool.io/gpu"] = fraction
    return {"apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {}, "annotations": notes},
            "spec": {"schedulerName": scheduler, "restartPolicy": "Never",
                     "containers": [{"name": "main", "image": "busybox", "resources": {"limits": limits}}], **spec}}


@dataclass
class Testbed:
    """A cluster, its CoreV1Api, a folder, and the gpupool control plane scheduling it (tests, the demo)."""

    cluster: KubeCluster
    core: Any  # kubernetes.client.CoreV1Api
    root: Path
    server: Server | None = None

    def start_gpupool(self, **env: str) -> Server:
        self.server = start_server(self.root / "gpupool", env={
            "GPUPOOL_KUBECONFIG": str(self.cluster.kubeconfig), "GPUPOOL_CYCLE_INTERVAL_S": "0.2", **env})
        return self.server

    def pods(self, namespace: str = "default") -> dict[str, dict[str, Any]]:
        data = json.loads(self.core.list_namespaced_pod(namespace, _preload_content=False).data)
        return {p["metadata"]["name"]: p for p in data["items"]}

    def create_pod(self, body: dict[str, Any], namespace: str = "default") -> None:
        self.core.create_namespaced_pod(namespace, body, _preload_content=False)

    def namespace(self, name: str) -> None:
        self.core.create_namespace({"metadata": {"name": name}}, _preload_content=False)

    def wait_bound(self, names: list[str], namespace: str = "default", timeout_s: float = 60) -> dict[str, Any]:
        def bound() -> dict[str, Any] | None:
            pods = self.pods(namespace)
            ok = all(pods.get(n, {}).get("spec", {}).get("nodeName") for n in names)
            return {n: pods[n] for n in names} if ok else None
        return wait_for(bound, timeout_s, f"pods {names} bound", step_s=0.2)

    def condition(self, name: str, namespace: str = "default") -> dict[str, Any] | None:
        pod = self.pods(namespace).get(name) or {}
        for c in (pod.get("status") or {}).get("conditions") or []:
            if c.get("type") == "PodScheduled":
                return c
        return None

    def events(self, name: str, namespace: str = "default") -> list[dict[str, Any]]:
        data = json.loads(self.core.list_namespaced_event(namespace, _preload_content=False).data)
        return [e for e in data["items"] if e["involvedObject"].get("name") == name]
