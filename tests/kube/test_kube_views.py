"""Kubernetes pods in gpupool's own views and ledger (issue 34, item 6), on a real kube-apiserver: a pod gpupool
binds is a job of `gpupool jobs` whose state follows the pod, its run interval is billed once under its queue and
its namespace's project (across a `kill -9` of the scheduler between bind and completion), `gpupool nodes` lists the
Kubernetes nodes, `gpupool job why` gives the core's reason for a pod that fits nowhere, and another organisation's
tenant sees none of it."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Any

from gpupool.devtools.harness import Server, kill_server, restart_server, wait_for
from gpupool.devtools.kube_cluster import Testbed as Kube
from gpupool.devtools.kube_cluster import add_node, pod_body

GPUPOOL = [sys.executable, "-m", "gpupool.cli.main"]
FAST_METER = {"GPUPOOL_METERING_INTERVAL_S": "0.5"}


def cli(server: Server, *args: str) -> str:
    env = {**os.environ, "GPUPOOL_URL": server.url, "GPUPOOL_TOKEN": server.token, "COLUMNS": "250"}
    done = subprocess.run([*GPUPOOL, *args], capture_output=True, text=True, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def pod_job(server: Server, name: str) -> dict[str, Any] | None:
    with server.client() as api:
        jobs = api.get("/jobs", params={"limit": 500}).json()["items"]
    return next((j for j in jobs if j["name"] == name), None)


def job_in(server: Server, name: str, state: str, timeout_s: float = 60) -> dict[str, Any]:
    return wait_for(lambda: (j := pod_job(server, name)) is not None and j["state"] == state and j, timeout_s,
                    f"{name}'s job {state}")


def usage(server: Server, by: str) -> dict[str, dict[str, Any]]:
    with server.client() as api:
        return {row["key"]: row for row in api.get("/usage", params={"by": by}).json()}


def test_a_pods_run_is_a_job_billed_once_under_its_queue_and_namespace_across_a_kill_9(kube: Kube) -> None:
    add_node(kube.core, "gpu-a", gpus=2, model="NVIDIA-A100-SXM4-80GB")
    kube.namespace("team-a")
    server = kube.start_gpupool(**FAST_METER)
    run_s = 4
    kube.create_pod(pod_body("trainer", gpus=2, annotations={"gpupool.test/run-seconds": str(run_s)}), "team-a")
    running = job_in(server, "trainer", "running")
    assert (running["project"], running["queue"], running["user"]) == ("team-a", "default", "kubernetes")
    assert running["gpus"] == "2"
    assert "trainer" in cli(server, "jobs")
    assert kill_server(server) == -9  # bound and running; it ends while no scheduler runs
    wait_for(lambda: kube.pods("team-a")["trainer"]["status"].get("phase") == "Succeeded", 30, "the pod to end")
    server = kube.server = restart_server(server)  # the fixture stops the one that runs
    done = job_in(server, "trainer", "succeeded")
    with server.client() as api:
        shown = api.get(f"/jobs/{done['id']}").json()
    [allocation] = shown["allocations"]
    assert allocation["node"] == "gpu-a" and [g["milli"] for g in allocation["gpus"]] == [1000, 1000]
    by_queue = wait_for(lambda: (u := usage(server, "queue")).get("default") and u, 30, "the pod's usage metered")
    # the pod's own timestamps (whole seconds) bound its interval: run_s, give or take the seconds they round off
    assert run_s - 1 <= by_queue["default"]["gpu_hours"] * 3600 / 2 <= run_s + 2, by_queue
    assert by_queue["default"]["entries"] == 1, "billed once, though the scheduler restarted in the middle"
    by_project = usage(server, "project")
    assert by_project["team-a"]["gpu_hours"] == by_queue["default"]["gpu_hours"]
    assert set(usage(server, "model")) == {"NVIDIA-A100-SXM4-80GB"}, "priced at its node's GPU model"
    with server.client() as api:
        jobs = [j for j in api.get("/jobs", params={"limit": 500}).json()["items"] if j["name"] == "trainer"]
    assert len(jobs) == 1, "one job for the pod, though the restarted scheduler listed it again"


def test_nodes_top_and_why_show_pods_beside_agents_work(kube: Kube) -> None:
    add_node(kube.core, "gpu-a", gpus=8)
    server = kube.start_gpupool()
    kube.create_pod(pod_body("huge", gpus=16))
    kube.create_pod(pod_body("worker", fraction="0.5"))
    kube.wait_bound(["worker"])
    pending = wait_for(lambda: (j := pod_job(server, "huge")) and j.get("reason") and j, 30, "huge's reason")
    why = cli(server, "job", "why", pending["id"])
    assert "too few GPUs on node" in why, why
    with server.client() as api:
        said = api.get(f"/jobs/{pending['id']}/why").json()
    assert said["kind"] == "no_node_fits" and said["message"] in (kube.condition("huge") or {}).get("message", "")
    job_in(server, "worker", "running")
    nodes = cli(server, "nodes")
    line = next(ln for ln in nodes.splitlines() if "gpu-a" in ln)
    assert "kubernetes" in line and ":0.5" in line, nodes
    with server.client() as api:
        [shown] = [n for n in api.get("/nodes").json() if n["name"] == "gpu-a"]
        top = api.get("/top").json()
    assert shown["source"] == "kubernetes" and shown["tasks"] == 1
    assert [(r["node"], r["gpus"], r["project"]) for r in top] == [("gpu-a", 0.5, "default")]
    with server.client() as api:
        refused = api.post(f"/jobs/{pending['id']}/cancel")
    assert refused.status_code == 409 and "kubectl delete pod" in refused.json()["detail"]


def test_a_deleted_pod_ends_its_job_and_another_organisation_sees_none_of_it(kube: Kube) -> None:
    add_node(kube.core, "gpu-a", gpus=1)
    server = kube.start_gpupool()
    kube.create_pod(pod_body("first", gpus=1))
    kube.create_pod(pod_body("second", gpus=1))
    job_in(server, "first", "running")
    waiting = job_in(server, "second", "pending")
    kube.core.delete_namespaced_pod("second", "default", _preload_content=False)
    job_in(server, "second", "cancelled")
    with server.client() as api:
        api.post("/orgs", json={"name": "other"}).raise_for_status()
        api.post("/users", json={"name": "outsider", "role": "tenant-admin", "org": "other"}).raise_for_status()
        outsider = api.post("/tokens", json={"user": "outsider", "org": "other"}).json()["token"]
    with server.client(outsider) as api:
        assert api.get("/jobs").json()["items"] == []
        assert api.get(f"/jobs/{waiting['id']}").status_code == 404
        assert api.get(f"/jobs/{waiting['id']}/why").status_code == 404
        assert api.get("/top").json() == []
