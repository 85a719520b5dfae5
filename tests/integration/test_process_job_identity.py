"""S12 (issue 41, finding 1; RELIABILITY.md §3.2 S8 extended to process jobs): what a job without an image can do on
its node, tried by jobs that two tenants' members submit through the API to a real control plane and real agents
(running as root, as in CI, so jobs get transient uids).

- no job runs as uid or gid 0, nor with group 0; each has no_new_privs, umask 077 and its own 0700 work folder;
- no job can read any file, nor list any folder, of the control plane's or the agents' data folders (walked by the
  test while a job's own state is in them);
- a job of tenant B cannot list or read tenant A's work folder, list the work root, nor signal A's job (EPERM);
- an order's environment (LD_PRELOAD of a library a job left behind) never reaches anything running as root;
- a job that daemonises (setsid + double fork) is killed when it ends, and its uid goes to the next job (on a node
  given one uid) only after: that job finds the daemon gone (or a zombie waiting for init to reap it), where it
  would otherwise share a uid with it and could signal it, trace it or read its memory.

The cluster lives in a folder any user may pass through, so that only gpupool's own permissions stand between the
jobs and the data folders (pytest's temporary folders alone would stop them).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from agent_cluster import JOB_PYTHON, Cluster, wait_for

from gpupool.agent.runtime.procfs import read_stat
from gpupool.agent.runtime.uids import ids_in_use, names_an_account, processes_of
from gpupool.devtools import jobdirs
from gpupool.devtools.figures import figure

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(os.geteuid() != 0, reason="jobs get transient uids only from an agent run as root")]

JOB = r"""
import errno, json, os, sys, time

def attempt(action, *args):
    try:
        action(*args)
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

def read(path):
    with open(path, "rb") as handle:
        handle.read(1)

def publish(name, value):  # readable by a job of another uid (the job's umask is 077)
    tmp = os.path.join(box, name + ".tmp")
    with open(tmp, "w") as out:
        json.dump(value, out)
    os.chmod(tmp, 0o644)
    os.rename(tmp, os.path.join(box, name))

def await_file(name):
    while not os.path.exists(os.path.join(box, name)):
        time.sleep(0.05)
    with open(os.path.join(box, name)) as handle:
        return json.load(handle)

def report(**fields):
    print("RESULT " + json.dumps(fields, sort_keys=True), flush=True)

mode, box = sys.argv[1], sys.argv[2]
who = {"uid": os.getuid(), "euid": os.geteuid(), "gid": os.getgid(), "groups": os.getgroups()}
if mode == "identity":
    status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
    mask = os.umask(0)
    here = os.stat(".")
    report(**who, no_new_privs=status["NoNewPrivs"].strip(), umask=oct(mask), home=os.environ["HOME"],
           cwd=os.getcwd(), cwd_mode=oct(here.st_mode & 0o777), cwd_owner=here.st_uid)
elif mode == "read":
    targets = await_file("targets.json")
    report(**who, files={p: attempt(read, p) for p in targets["files"]},
           dirs={p: attempt(os.listdir, p) for p in targets["dirs"]})
elif mode == "hold":
    with open("secret", "w") as out:
        out.write("tenant A's secret")
    publish("a.json", {"pid": os.getpid(), "work": os.getcwd()})
    report(**who)
    await_file("release")
elif mode == "pry":
    a = await_file("a.json")
    secret = os.path.join(a["work"], "secret")
    report(**who, list_work=attempt(os.listdir, a["work"]), read_secret=attempt(read, secret),
           signal=attempt(os.kill, a["pid"], 0), list_work_root=attempt(os.listdir, os.path.dirname(a["work"])))
elif mode == "daemon":
    if os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            publish("daemon.json", {"pid": os.getpid()})
            while True:
                time.sleep(1)
        os._exit(0)
    os.wait()
    report(**who, daemon=await_file("daemon.json")["pid"])
elif mode == "reuse":
    daemon = await_file("daemon.json")["pid"]
    try:
        with open(f"/proc/{daemon}/stat") as handle:
            state = handle.read().rsplit(")", 1)[1].split()[0]
    except OSError:
        state = "gone"
    report(**who, daemon_state=state)
"""


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with jobdirs.open_folder("gpupool-s12-") as base, Cluster(base / "cluster") as made:
        yield made
    assert made.violations == []


def tenant(cluster: Cluster, org: str) -> dict[str, Any]:
    """A fresh organisation with a project, a queue and a member; the member's client and where it submits."""
    op = cluster.api
    for path, body in (("/orgs", {"name": org}), ("/projects", {"name": "lab", "org": org}),
                       ("/queues", {"name": f"{org}-q", "org": org}),
                       ("/users", {"name": "member", "org": org, "role": "member", "projects": ["lab"]})):
        assert op.post(path, json=body).status_code == 201, (path, body)
    token = op.post("/tokens", json={"user": "member", "org": org}).json()["token"]
    assert cluster.server is not None
    return {"client": cluster.server.client(token), "queue": f"{org}-q"}


def submit(cluster: Cluster, who: dict[str, Any], mode: str, box: Path, model: str, **env: str) -> str:
    body = {"command": [JOB_PYTHON, "-c", JOB, mode, str(box)], "gpus": "1", "gpu_models": [model], "cpus": "0.1",
            "memory_mib": 64, "queue": who["queue"], "project": "lab", "env": env}
    response = who["client"].post("/jobs", json=body)
    assert response.status_code == 201, response.text
    return str(response.json()["id"])


def result(cluster: Cluster, job_id: str) -> dict[str, Any]:
    """What the job printed on its RESULT line, read through the API's log route."""
    def line() -> str | None:
        found = [x for x in cluster.logs(job_id).splitlines() if x.startswith("RESULT ")]
        return found[0] if found else None
    return dict(json.loads(wait_for(line, 60, f"job {job_id}'s result")[len("RESULT "):]))


def walk(folders: list[Path]) -> dict[str, list[str]]:
    """Every file and folder in `folders` (the test runs as root and sees them all)."""
    files, dirs = [], []
    for top in folders:
        for here, _, names in os.walk(top):
            dirs.append(here)
            files += [os.path.join(here, n) for n in names if os.path.isfile(os.path.join(here, n))]
    return {"files": sorted(files), "dirs": sorted(dirs)}


PRELOAD_C = r"""
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>
__attribute__((constructor)) static void loaded(void) {
    const char *out = getenv("PRELOAD_WITNESS");
    FILE *f;
    if (out && geteuid() == 0 && (f = fopen(out, "a"))) { fprintf(f, "loaded as root in %d\n", getpid()); fclose(f); }
}
"""


def preload_library(box: Path) -> Path | None:
    """A library that notes when root loads it, left where any job can read it (as an earlier job could); None
    without gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        return None
    (box / "evil.c").write_text(PRELOAD_C)
    subprocess.run([gcc, "-shared", "-fPIC", "-o", str(box / "evil.so"), str(box / "evil.c")], check=True,
                   capture_output=True)
    (box / "evil.so").chmod(0o755)
    return box / "evil.so"


def one_free_uid() -> int:
    """A uid outside the default transient range that names no account and no process uses."""
    busy = ids_in_use()
    return next(u for u in range(60900, 61100) if u not in busy and not names_an_account(u))


def read_data_folders(cluster: Cluster, who: dict[str, Any], box: Path,
                      model: str) -> tuple[dict[str, list[str]], dict[str, Any]]:
    """Walk the control plane's and the agents' data folders, and let a job of `who` try every file and folder."""
    assert cluster.server is not None
    targets = walk([cluster.server.data_dir, *(agent.data_dir for agent in cluster.agents.values())])
    (box / "targets.tmp").write_text(json.dumps(targets))
    (box / "targets.tmp").rename(box / "targets.json")
    return targets, result(cluster, submit(cluster, who, "read", box, model))


def daemon_then_reuse(cluster: Cluster, a: dict[str, Any], b: dict[str, Any], box: Path, model: str,
                      seen: dict[str, dict[str, Any]]) -> int:
    """A's job leaves a daemon and ends; then B's job on the same one-uid node. The processes left of A's."""
    daemon_job = submit(cluster, a, "daemon", box, model)
    seen["daemon"] = result(cluster, daemon_job)
    assert cluster.wait_job(daemon_job)["state"] == "succeeded"
    daemon, uid = read_stat(seen["daemon"]["daemon"]), seen["daemon"]["uid"]
    others = processes_of(uid) if uid != 0 else []  # (uid 0 would be every root process, not the job's)
    solo = cluster.agents["solo"].data_dir / "workloads"
    wait_for(lambda: not list(solo.glob("*/state.json")), 30, "solo to forget the daemon's job (its uid released)")
    seen["reuse"] = result(cluster, cluster.wait_job(submit(cluster, b, "reuse", box, model))["id"])
    return int(daemon is not None and not daemon.is_dead) + len(others)


def privileged(seen: dict[str, Any]) -> bool:
    return 0 in (seen["uid"], seen["euid"], seen["gid"]) or 0 in seen["groups"]


def test_s12_process_jobs_run_unprivileged_private_and_leave_nothing_behind(cluster: Cluster) -> None:
    solo_uid = one_free_uid()
    cluster.start_agent("n1", "2xA100-80GB")
    cluster.start_agent("solo", "1xH100-80GB", extra=("--job-uid-range", f"{solo_uid}-{solo_uid}"))
    nodes = cluster.wait_ready(["n1", "solo"])
    a100, h100 = (nodes[n]["gpus"][0]["model"] for n in ("n1", "solo"))
    a, b = tenant(cluster, "s12-alpha"), tenant(cluster, "s12-beta")
    box = cluster.drop_box("s12")
    seen: dict[str, dict[str, Any]] = {}

    # 1. who a job is
    library, witness = preload_library(box), cluster.root / "preload-witness"  # the witness: where no job writes
    preload = {"LD_PRELOAD": str(library), "PRELOAD_WITNESS": str(witness)} if library else {}
    seen["identity"] = result(cluster, cluster.wait_job(submit(cluster, a, "identity", box, a100, **preload))["id"])
    # 2. tenant A holds a secret in its work folder; tenant B tries it, A's process, and the work root
    hold = submit(cluster, a, "hold", box, a100)
    seen["hold"] = result(cluster, hold)
    seen["pry"] = result(cluster, submit(cluster, b, "pry", box, a100))
    # 3. every file and folder of the data folders, while A's workload is recorded in n1's
    targets, seen["read"] = read_data_folders(cluster, b, box, a100)
    (box / "release").write_text("{}")
    assert cluster.wait_job(hold)["state"] == "succeeded"
    # 4. a daemon outliving its job, on the node with one uid; then the next job there, of the other tenant
    leftover = daemon_then_reuse(cluster, a, b, box, h100, seen)

    identity, pry, read = seen["identity"], seen["pry"], seen["read"]
    readable = sorted(p for p, outcome in read["files"].items() if outcome == "ok")
    listable = sorted(p for p, outcome in read["dirs"].items() if outcome == "ok")
    cross_read = sum(pry[k] == "ok" for k in ("list_work", "read_secret"))
    reused = seen["reuse"]["uid"] == seen["daemon"]["uid"] and seen["reuse"]["daemon_state"] in ("gone", "Z", "X")
    figure(f"S12 process_jobs uid0={sum(privileged(s) for s in seen.values())}/{len(seen)} "
           f"data_files_readable={len(readable)}/{len(targets['files'])} "
           f"data_dirs_listable={len(listable)}/{len(targets['dirs'])} cross_job_read={cross_read} "
           f"cross_job_signal={int(pry['signal'] == 'ok')} work_root_listable={int(pry['list_work_root'] == 'ok')} "
           f"leftover_procs={leftover} uid_reused_only_after_exit={int(reused)} "
           f"preload_as_root={len(witness.read_text().splitlines()) if witness.exists() else 0 if library else 'n/a'} "
           f"no_new_privs={identity['no_new_privs']} umask={identity['umask']} work_dir={identity['cwd_mode']}")

    assert [name for name, s in seen.items() if privileged(s)] == []
    assert (identity["no_new_privs"], identity["umask"], identity["cwd_mode"]) == ("1", "0o77", "0o700")
    assert identity["cwd_owner"] == identity["uid"] and identity["home"] == identity["cwd"]
    assert readable == [] and listable == []
    assert len(targets["files"]) >= 10  # keys, tokens, database, node.json, workload state and log: walked for real
    assert (pry["list_work"], pry["read_secret"], pry["signal"], pry["list_work_root"]) == (
        "EACCES", "EACCES", "EPERM", "EACCES")
    assert seen["hold"]["uid"] != pry["uid"]
    assert not witness.exists(), witness.read_text()
    assert leftover == 0 and reused, (leftover, seen["daemon"], seen["reuse"])


def test_local_user_mode_runs_each_job_as_its_users_account_and_refuses_the_rest(cluster: Cluster) -> None:
    """`--run-jobs-as local-user` (Slurm-style): the launch order names the submitting user, the agent runs the job
    as the local account of that name; the job of a user with no local account, or of one named as root's, fails
    (its launch is reported failed, the reason in the agent's log), and the node says "local-user"."""
    cluster.start_agent("site", "1xA100-80GB", extra=("--run-jobs-as", "local-user"))
    node = cluster.wait_ready(["site"])["site"]
    assert node["jobs_as"] == "local-user"
    op, org = cluster.api, "s12-site"
    assert op.post("/orgs", json={"name": org}).status_code == 201
    assert op.post("/projects", json={"name": "lab", "org": org}).status_code == 201
    assert op.post("/queues", json={"name": f"{org}-q", "org": org}).status_code == 201
    box, outcomes = cluster.drop_box("site"), {}
    for name in ("nobody", "gpupool-no-such-account", "root"):
        user = {"name": name, "org": org, "role": "member", "projects": ["lab"]}
        assert op.post("/users", json=user).status_code == 201, user
        token = op.post("/tokens", json={"user": name, "org": org}).json()["token"]
        member = {"client": cluster.server.client(token), "queue": f"{org}-q"}  # type: ignore[union-attr]
        job = cluster.wait_job(submit(cluster, member, "identity", box, node["gpus"][0]["model"]))
        outcomes[name] = (job["state"], result(cluster, job["id"])["uid"] if job["state"] == "succeeded" else None)
    assert outcomes == {"nobody": ("succeeded", 65534), "gpupool-no-such-account": ("failed", None),
                        "root": ("failed", None)}
    log = cluster.agents["site"].log()
    assert "has no account 'gpupool-no-such-account'" in log and "account 'root' is root or in group 0" in log
