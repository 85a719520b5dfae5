"""Issue 43 item 4: a gang's tasks get WORLD_SIZE, RANK, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT and a
hostfile, and meet over TCP with them: a 4-task gang on two real agents (fake GPUs), rank 0 listening on the port its
agent chose, the others connecting; all four ranks meet and the job succeeds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from agent_cluster import JOB_PYTHON, Cluster

pytestmark = pytest.mark.slow

# Rank 0 listens on MASTER_PORT; every other rank connects (retrying while rank 0 starts) and sends its rank; rank 0
# answers every rank with the sorted ranks it met, once all WORLD_SIZE - 1 have come. Each rank writes what it saw.
RENDEZVOUS = r"""
import json, os, socket, sys, time
env = {k: os.environ.get(k) for k in ("WORLD_SIZE", "RANK", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                                       "MASTER_PORT", "GPUPOOL_HOSTFILE", "GPUPOOL_HOSTS")}
world, rank, port = int(env["WORLD_SIZE"]), int(env["RANK"]), int(env["MASTER_PORT"])
deadline = time.time() + 60
if rank == 0:
    server = socket.create_server(("", port))
    server.settimeout(60)
    peers = []
    while len(peers) < world - 1:
        conn, _ = server.accept()
        peers.append((int(conn.recv(16).decode()), conn))
    met = sorted([0] + [r for r, _ in peers])
    for _, conn in peers:
        conn.sendall(json.dumps(met).encode())
        conn.close()
else:
    while True:
        try:
            conn = socket.create_connection((env["MASTER_ADDR"], port), timeout=5)
            break
        except OSError:
            if time.time() > deadline:
                raise
            time.sleep(0.1)
    conn.sendall(str(rank).encode())
    met = json.loads(conn.recv(4096).decode())
hostfile = open(env["GPUPOOL_HOSTFILE"]).read()
with open(os.path.join(sys.argv[1], f"rank-{rank}.json"), "w") as out:
    json.dump({"env": env, "met": met, "hostfile": hostfile}, out)
"""


def test_a_four_task_gang_on_two_agents_meets_over_tcp(cluster: Cluster):
    for name in ("a", "b"):
        cluster.start_agent(name, fake_gpus="2xA100-80GB")
    cluster.wait_ready(["a", "b"])
    box = cluster.drop_box("ranks")
    job_id = cluster.submit(command=[JOB_PYTHON, "-c", RENDEZVOUS, str(box)], gpus="1", tasks=4)
    job = cluster.wait_job(job_id, timeout_s=60)
    assert job["state"] == "succeeded", (job, [cluster.logs(job_id, task=t) for t in range(4)])
    seen = {rank: json.loads((Path(box) / f"rank-{rank}.json").read_text()) for rank in range(4)}
    nodes = {a["task_index"]: a["node"] for a in job["allocations"]}
    assert sorted(set(nodes.values())) == ["a", "b"]
    ports = {s["env"]["MASTER_PORT"] for s in seen.values()}
    assert len(ports) == 1 and int(ports.pop()) > 0
    for rank, s in seen.items():
        env = s["env"]
        assert s["met"] == [0, 1, 2, 3]
        assert (env["WORLD_SIZE"], env["RANK"], env["MASTER_ADDR"]) == ("4", str(rank), "127.0.0.1")
        same_node = sorted(t for t, n in nodes.items() if n == nodes[rank])
        assert (env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (str(same_node.index(rank)), str(len(same_node)))
        assert s["hostfile"] == "127.0.0.1 slots=2\n127.0.0.1 slots=2\n"
        assert env["GPUPOOL_HOSTS"] == "127.0.0.1:2,127.0.0.1:2"
