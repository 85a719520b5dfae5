"""End to end with real agent processes: a control plane on SQLite and agents with fake GPUs on loopback, with the
RELIABILITY.md §2.2 timings scaled by 1/20 (heartbeat 0.25 s, suspect 0.75 s, lost G 3 s, self-fence F 2 s).

1. jobs run end to end: placement, launch, logs (with the CUDA_VISIBLE_DEVICES each task saw), exit codes, release;
2. kill -9 of an agent running a job: the job is requeued on another node and finishes exactly once, and the
   two attempts never run at the same time (marker-file timestamps, one host clock);
3. an agent restarted gracefully re-adopts its running workload (same pid, attempt 1), which then succeeds;
4. a partition (agent in a network namespace, its veth cut): the agent self-fences before the node is declared
   lost, and the attempts never overlap (T2.b).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from datetime import UTC, datetime

import pytest
from agent_cluster import Cluster, marker_command, read_marker, wait_for

pytestmark = pytest.mark.slow

PRINT_GPUS = ["sh", "-c", 'echo "task=$GPUPOOL_TASK_INDEX attempt=$GPUPOOL_ATTEMPT CVD=$CUDA_VISIBLE_DEVICES"']


def saw(log: str) -> list[str]:
    """The CUDA_VISIBLE_DEVICES value a PRINT_GPUS task printed, as a list of UUIDs."""
    line = next(x for x in log.splitlines() if "CVD=" in x)
    value = line.split("CVD=", 1)[1].strip()
    return value.split(",") if value else []


def requeued_after(cluster: Cluster, job_id: str, since: float) -> float:
    """Seconds from `since` to the job's "requeued" event (the server stores UTC, possibly without a zone)."""
    at = datetime.fromisoformat(next(e["at"] for e in cluster.events(job_id) if e["kind"] == "requeued"))
    return (at if at.tzinfo else at.replace(tzinfo=UTC)).timestamp() - since


def test_jobs_run_end_to_end_with_logs_exit_codes_and_release(cluster: Cluster):
    for name in ("a", "b", "c"):
        cluster.start_agent(name)
    cluster.wait_ready(["a", "b", "c"])
    half = cluster.submit(command=PRINT_GPUS, gpus="0.5")
    whole = cluster.submit(command=PRINT_GPUS, gpus="1")
    gang = cluster.submit(command=PRINT_GPUS, gpus="1", tasks=2)
    failing = cluster.submit(command=["sh", "-c", "echo about to fail; exit 3"], gpus="1")

    for job_id, tasks in ((half, 1), (whole, 1), (gang, 2)):
        job = cluster.wait_job(job_id)
        assert job["state"] == "succeeded" and job["exit_code"] == 0 and job["attempt"] == 1, job
        allocations = sorted(job["allocations"], key=lambda a: a["task_index"])
        assert [a["task_index"] for a in allocations] == list(range(tasks))
        for allocation in allocations:
            assert allocation["state"] == "released" and allocation["exit_code"] == 0, allocation
            log = cluster.logs(job_id, task=allocation["task_index"])
            assert f"task={allocation['task_index']} attempt=1 " in log, log
            granted = cluster.granted_uuids(allocation)
            assert saw(log) == granted and all(u.startswith("GPU-fake-") for u in granted), (log, granted)
    assert cluster.job(half)["allocations"][0]["gpus"][0]["milli"] == 500

    failed = cluster.wait_job(failing)
    assert failed["state"] == "failed" and failed["exit_code"] == 3, failed
    assert failed["allocations"][0]["exit_code"] == 3
    assert "about to fail" in cluster.logs(failing)

    wait_for(lambda: not any(cluster.allocated_milli().values()), 10, "every allocation to be released")
    assert all(node["state"] == "ready" for node in cluster.nodes().values())


def test_kill_9_of_an_agent_requeues_its_job_elsewhere_without_overlap(cluster: Cluster):
    """SIGKILL leaves the workload without its agent: nothing may run attempt 1 alongside attempt 2."""
    names = ["a", "b", "c"]
    for name in names:
        cluster.start_agent(name)
    cluster.wait_ready(names)
    markers = cluster.drop_box("markers")
    job_id = cluster.submit(command=marker_command(markers, 8), gpus="1")
    wait_for(lambda: read_marker(markers / "attempt-1"), 20, "attempt 1 to start")
    victim = cluster.job(job_id)["allocations"][0]["node"]
    cluster.agents[victim].signal(signal.SIGKILL)
    cluster.agents[victim].wait()
    killed_at = time.time()

    job = cluster.wait_job(job_id, timeout_s=40)
    first, second = read_marker(markers / "attempt-1"), read_marker(markers / "attempt-2")
    assert job["state"] == "succeeded" and job["attempt"] == 2, (job, cluster.events(job_id))
    by_attempt = {a["attempt"]: a for a in job["allocations"]}
    assert by_attempt[1]["node"] == victim and by_attempt[1]["state"] == "released"
    assert by_attempt[2]["node"] != victim and by_attempt[2]["exit_code"] == 0
    assert first is not None and second is not None and second.done
    assert not first.done, "attempt 1 ran to its end although its node was lost and the job requeued"
    assert first.last < second.first, (
        f"attempts overlapped by {first.last - second.first:.2f} s: attempt 1 (node {victim}, agent SIGKILLed at "
        f"{killed_at:.2f}) ran until {first.last:.2f}, attempt 2 started at {second.first:.2f}")
    assert not cluster.agents[victim].workload_pids(), "the lost node's workload still runs"
    assert list((cluster.agents[victim].data_dir / "workloads").glob("*/fenced")), "no watchdog fenced attempt 1"
    print(f"kill -9: attempt 1 stopped {first.last - killed_at:.2f} s after the kill, requeued after "
          f"{requeued_after(cluster, job_id, killed_at):.2f} s, attempt 2 started {second.first - first.last:.2f} s "
          "after attempt 1 ended")


def test_graceful_agent_restart_re_adopts_the_running_workload(make_cluster):
    # F 8 s / G 12 s here: the new agent (a new Python process) must reach the control plane within F of the last
    # frame the old one heard, or the workload's watchdog fences it; 2 s is too tight on a busy 2-core machine.
    cluster: Cluster = make_cluster(GPUPOOL_MAX_DISCONNECT_S="8", GPUPOOL_LOST_AFTER_S="12")
    agent = cluster.start_agent("a")
    cluster.wait_ready(["a"])
    markers = cluster.drop_box("markers")
    job_id = cluster.submit(command=marker_command(markers, 5), gpus="1")
    before = wait_for(lambda: read_marker(markers / "attempt-1"), 20, "attempt 1 to start")
    cluster.wait_job(job_id, states=["running"])

    agent.signal(signal.SIGTERM)
    assert agent.wait() == 0
    assert len(agent.workload_pids()) == 1, "SIGTERM of the agent must leave its workload running"
    cluster.start_agent("a", join=False)
    wait_for(lambda: "adopted 1 workload" in agent.log(), 20, "the new agent to adopt the workload")

    job = cluster.wait_job(job_id, timeout_s=20)
    after = read_marker(markers / "attempt-1")
    assert job["state"] == "succeeded" and job["attempt"] == 1, (job, cluster.events(job_id))
    assert after is not None and after.done and after.pid == before.pid
    assert not (markers / "attempt-2").exists()
    assert [e["kind"] for e in cluster.events(job_id)] == ["submitted", "scheduled", "running", "succeeded"]
    assert "already has a record" not in agent.log()


# partitions -------------------------------------------------------------------------------------------


def _netns_unavailable() -> str | None:
    if os.geteuid() != 0:
        return "network namespaces need root (ip netns add); this run is not root"
    if shutil.which("ip") is None:
        return "iproute2 (`ip`) is not installed"
    probe = f"gpupool-probe-{os.getpid()}"
    made = subprocess.run(["ip", "netns", "add", probe], capture_output=True, text=True)
    if made.returncode != 0:
        return f"`ip netns add` failed: {made.stderr.strip()}"
    subprocess.run(["ip", "netns", "del", probe], capture_output=True)
    return None


class Veth:
    """A network namespace joined to the host by a veth pair on 10.X.Y.0/30: host .1, namespace .2."""

    def __init__(self) -> None:
        tag = os.getpid() % 60000
        self.ns, self.host_if, self.ns_if = f"gpupool-t{tag}", f"gpv{tag}h", f"gpv{tag}n"
        self.host_ip, self.ns_ip = f"10.{200 + tag // 15000}.{tag % 15000 // 60}.{tag % 60 * 4 + 1}", ""
        a, b, c, d = self.host_ip.split(".")
        self.ns_ip = f"{a}.{b}.{c}.{int(d) + 1}"

    def __enter__(self) -> Veth:
        self.run("ip", "netns", "add", self.ns)
        self.run("ip", "link", "add", self.host_if, "type", "veth", "peer", "name", self.ns_if)
        self.run("ip", "link", "set", self.ns_if, "netns", self.ns)
        self.run("ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_if)
        self.run("ip", "link", "set", self.host_if, "up")
        self.run("ip", "-n", self.ns, "addr", "add", f"{self.ns_ip}/30", "dev", self.ns_if)
        self.run("ip", "-n", self.ns, "link", "set", self.ns_if, "up")
        self.run("ip", "-n", self.ns, "link", "set", "lo", "up")
        return self

    def __exit__(self, *exc: object) -> None:
        subprocess.run(["ip", "link", "del", self.host_if], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.ns], capture_output=True)

    def cut(self) -> None:
        self.run("ip", "link", "set", self.host_if, "down")

    def heal(self) -> None:
        self.run("ip", "link", "set", self.host_if, "up")

    @staticmethod
    def run(*argv: str) -> None:
        done = subprocess.run(argv, capture_output=True, text=True)
        assert done.returncode == 0, f"{' '.join(argv)}: {done.stderr}"

    @property
    def prefix(self) -> list[str]:
        return ["ip", "netns", "exec", self.ns]


def test_partitioned_agent_self_fences_before_its_node_is_lost(make_cluster):
    why = _netns_unavailable()
    if why is not None:
        pytest.skip(f"partition test needs network namespaces: {why}")
    with Veth() as link:
        # the agent dials the host end of the veth: the channel's certificate must name it
        cluster: Cluster = make_cluster(server_host="0.0.0.0", GPUPOOL_AGENT_TLS_NAMES=link.host_ip)
        port = cluster.url.rsplit(":", 1)[1]
        cluster.start_agent("cut", prefix=link.prefix, server_url=f"http://{link.host_ip}:{port}")
        for name in ("b", "c"):
            cluster.start_agent(name)
        cluster.wait_ready(["cut", "b", "c"])
        for name in ("b", "c"):  # attempt 1 must land on the node in the namespace
            assert cluster.api.post(f"/nodes/{name}/cordon").status_code == 200
        markers = cluster.drop_box("markers")
        job_id = cluster.submit(command=marker_command(markers, 8, first_s=300), gpus="1")  # 1 must be fenced
        wait_for(lambda: read_marker(markers / "attempt-1"), 20, "attempt 1 to start")
        for name in ("b", "c"):
            assert cluster.api.post(f"/nodes/{name}/uncordon").status_code == 200
        link.cut()
        cut_at = time.time()

        job = cluster.wait_job(job_id, timeout_s=40)
        first, second = read_marker(markers / "attempt-1"), read_marker(markers / "attempt-2")
        assert job["state"] == "succeeded" and job["attempt"] == 2, (job, cluster.events(job_id))
        by_attempt = {a["attempt"]: a for a in job["allocations"]}
        assert by_attempt[1]["node"] == "cut" and by_attempt[2]["node"] != "cut"
        assert first is not None and second is not None and second.done and not first.done
        assert first.last < second.first, f"attempts overlapped by {first.last - second.first:.2f} s"
        fenced_after = first.last - cut_at
        assert fenced_after < 3.0, f"attempt 1 ran {fenced_after:.2f} s after the cut (fence F 2 s, lost G 3 s)"
        assert "self-fencing" in cluster.agents["cut"].log()
        print(f"partition: attempt 1 stopped {fenced_after:.2f} s after the cut, requeued after "
              f"{requeued_after(cluster, job_id, cut_at):.2f} s, attempt 2 started {second.first - first.last:.2f} s "
              "after attempt 1 ended")

        link.heal()  # the agent returns: it reports attempt 1 fenced, which changes nothing, and takes work again
        wait_for(lambda: cluster.nodes()["cut"]["state"] == "ready", 30, "the partitioned node to be ready again")
        assert cluster.job(job_id)["state"] == "succeeded" and cluster.job(job_id)["attempt"] == 2
        wait_for(lambda: not any(cluster.allocated_milli().values()), 10, "every allocation to be released")
        for name in ("b", "c"):
            assert cluster.api.post(f"/nodes/{name}/cordon").status_code == 200
        again = cluster.wait_job(cluster.submit(command=["true"], gpus="1"))
        assert again["state"] == "succeeded" and again["allocations"][0]["node"] == "cut"
