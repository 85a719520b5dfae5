"""An admin's whole lifecycle through the CLI only (issue 43): a real control plane and a real agent with fake GPUs
on loopback, every step a `gpupool` process. The operator creates an organisation, a project, users and their
tokens; a user submits; the quota tree refuses a child guaranteeing more than its parent allows and warns about a
guarantee above the pool; queues and budgets are updated (with --dry-run) and deleted, a hard budget set by
mistake, which holds the user's next job, is undone so that the job starts, and the node is drained and removed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "integration"))  # agent_cluster

from agent_cluster import JOB_PYTHON, SCALED, Cluster  # noqa: E402

from gpupool.devtools.harness import wait_for  # noqa: E402

GPUPOOL = [sys.executable, "-m", "gpupool.cli.main"]


class Cli:
    """`gpupool` as one user (a token) of the control plane at `url`."""

    def __init__(self, url: str, token: str, home: Path) -> None:
        self.env = {**os.environ, "GPUPOOL_URL": url, "GPUPOOL_TOKEN": token, "XDG_CONFIG_HOME": str(home),
                    "COLUMNS": "200"}

    def run(self, *args: str, status: int = 0) -> str:
        done = subprocess.run([*GPUPOOL, *args], env=self.env, capture_output=True, text=True, timeout=60)
        said = f"{done.stdout}{done.stderr}"
        assert done.returncode == status, f"gpupool {' '.join(args)}: exit {done.returncode}\n{said}"
        return done.stdout + done.stderr

    def json(self, *args: str) -> object:
        """The command's --json answer (given before a `--` that starts a job's command)."""
        at = args.index("--") if "--" in args else len(args)
        return json.loads(self.run(*args[:at], "--json", *args[at:]))


def test_an_admin_runs_the_pool_through_the_cli_alone(tmp_path: Path) -> None:
    with Cluster(tmp_path / "pool", env={**SCALED, "GPUPOOL_CURRENCY": "EUR"}) as pool:
        assert pool.server is not None
        op = Cli(pool.url, pool.server.token, tmp_path / "op")
        _join_a_node(pool, op)
        boss, alice = _tenant(pool, op, tmp_path)
        _quota_tree(op)
        job = _mistaken_hard_budget(pool, boss, alice)
        _queue_changes(op, boss, alice, job)
        _drain_and_remove(op)
        _tokens(boss, alice)
    assert not pool.violations


def _join_a_node(pool: Cluster, op: Cli) -> None:
    token = op.run("join-token", "create").splitlines()[0]
    assert token.count(" ") == 0 and len(token) > 20  # the token alone on its line, whole
    pool.start_agent("gpu-a", "2xA100-80GB", join=False, extra=["--join-token", token])
    pool.wait_ready(["gpu-a"])


def _tenant(pool: Cluster, op: Cli, home: Path) -> tuple[Cli, Cli]:
    """Organisation acme with project lab, a tenant admin (boss) and a member (alice), each with a token."""
    assert "created organisation acme" in op.run("org", "create", "acme")
    assert "created project lab in organisation acme" in op.run("project", "create", "lab", "--org", "acme")
    op.run("user", "create", "boss", "--org", "acme", "--role", "tenant-admin")
    assert "working in lab" in op.run("user", "create", "alice", "--org", "acme", "--project", "lab")
    assert {"boss": "tenant-admin", "alice": "member"}.items() <= {
        u["name"]: u["role"] for u in op.json("user", "list")}.items()  # type: ignore[union-attr]
    op.run("org", "ceiling", "acme", "--guaranteed-gpus", "2", "--weight", "2", "--max-priority", "0")
    tokens = {name: op.run("token", "create", "--user", name, "--org", "acme", "--name", "laptop").splitlines()[0]
              for name in ("boss", "alice")}
    boss, alice = (Cli(pool.url, tokens[n], home / n) for n in ("boss", "alice"))
    assert "alice (member) of organisation acme; projects: lab" in alice.run("whoami")
    return boss, alice


def _quota_tree(op: Cli) -> None:
    """The issue's case: a child guaranteeing 5 GPUs under a parent limited to 1 is refused, naming the figures; a
    guarantee above the 2-GPU pool is made with a warning."""
    assert "created queue vision of organisation acme at the top" in op.run(
        "queue", "create", "vision", "--org", "acme", "--guaranteed-gpus", "1", "--limit-gpus", "1")
    refused = op.run("queue", "create", "sub", "--org", "acme", "--parent", "vision", "--guaranteed-gpus", "5",
                     status=1)
    assert "guaranteed.gpus: 5 GPUs is above the limit of its parent queue 'vision', 1 GPU" in refused
    op.run("queue", "create", "sub", "--org", "acme", "--parent", "vision", "--guaranteed-gpus", "1")
    big = op.run("queue", "create", "big", "--org", "acme", "--guaranteed-gpus", "4")
    assert "warning: guaranteed.gpus: queue 'big' guarantees 4 GPUs, above the pool's 2 GPUs" in big
    assert "(dry run: nothing was changed)" in op.run("queue", "delete", "big", "--org", "acme", "--dry-run")
    assert "big" in [q["name"] for q in op.json("queues")]  # type: ignore[index,union-attr]
    op.run("queue", "delete", "big", "--org", "acme")
    assert "big" not in [q["name"] for q in op.json("queues")]  # type: ignore[index,union-attr]


def _mistaken_hard_budget(pool: Cluster, boss: Cli, alice: Cli) -> str:
    """A hard budget of 0.0001 GPU-hours, spent by alice's first job, holds her second until it is undone; the id
    prefixes the tables show name her jobs. Returns the second job's id."""
    assert "hard monthly budget of 0.0001 GPU-hours on project lab" in boss.run(
        "budget", "create", "--scope", "project", "--name", "lab", "--gpu-hours", "0.0001", "--hard")
    submit = ["submit", "--project", "lab", "--queue", "sub", "--gpus", "1", "--cpus", "0.1", "--memory-mib", "64"]
    first = alice.json(*submit, "--", JOB_PYTHON, "-c", "import time; time.sleep(2)")["id"]  # type: ignore[index]
    wait_for(lambda: "succeeded" in alice.run("job", "show", first[:12]), 60, "the first job to end")
    wait_for(lambda: boss.json("budget", "list")[0]["exceeded"], 30, "the budget to be spent")  # type: ignore[index]
    second = wait_for(lambda: _held(alice, submit), 60, "the spent budget to hold a new job")
    assert "would change hard: yes -> no" in boss.run("budget", "update", "project/lab", "--soft", "--dry-run")
    assert "budget_exhausted" in alice.run("job", "why", second[:12])  # a dry run changed nothing
    assert "changed gpu_hours: 0.0001 -> 100" in boss.run("budget", "update", "project/lab", "--gpu-hours", "100")
    wait_for(lambda: "succeeded" in alice.run("job", "show", second[:12]), 60, "the held job to run once undone")
    assert "12.34 EUR" in boss.run("budget", "create", "--scope", "queue", "--name", "sub", "--cents", "1234")
    listed = boss.run("budget", "list")
    assert "12.34 EUR" in listed and "0.00 EUR" in listed  # money with its currency, the used part too
    boss.run("budget", "delete", "queue/sub")
    assert "deleted the monthly budget of project lab" in boss.run("budget", "delete", "project/lab")
    assert boss.json("budget", "list") == []
    return str(second)


def _held(alice: Cli, submit: list[str]) -> str | None:
    """Submit a job; its id once the budget holds it, None when it ran (the scheduler reads budgets every few
    seconds: a job submitted just after the budget was spent may still start)."""
    job = str(alice.json(*submit, "--", JOB_PYTHON, "-c", "print('ran')")["id"])  # type: ignore[index]
    why = wait_for(lambda: (w := alice.json("job", "why", job[:12]))["kind"] != "queued" and w, 30, "a cycle")
    return job if why["kind"] == "budget_exhausted" else None  # type: ignore[index]


def _queue_changes(op: Cli, boss: Cli, alice: Cli, job: str) -> None:
    """Queues are changed within the tree's rules, and deleted with their waiting jobs moved."""
    refused = op.run("queue", "update", "sub", "--org", "acme", "--guaranteed-gpus", "2", status=1)
    assert "guaranteed.gpus: 2 GPUs is above the limit of its parent queue 'vision', 1 GPU" in refused
    dry = op.run("queue", "update", "vision", "--org", "acme", "--limit-gpus", "2", "--guaranteed-gpus", "2",
                 "--dry-run")
    assert "guaranteed: gpus=1 -> gpus=2" in dry and "limit: gpus=1 -> gpus=2" in dry
    op.run("queue", "update", "vision", "--org", "acme", "--limit-gpus", "2", "--guaranteed-gpus", "2")
    assert "changed guaranteed: gpus=1 -> gpus=2" in boss.run("queue", "update", "sub", "--guaranteed-gpus", "2")
    boss.run("queue", "create", "spare", "--parent", "vision", "--weight", "0", "--hold-unsatisfiable")
    held = alice.json("submit", "--project", "lab", "--queue", "spare", "--gpus", "8", "--", "true")
    refused = boss.run("queue", "delete", "spare", status=1)
    assert "move_to: queue 'spare' holds 1 waiting jobs" in refused
    moved = boss.run("queue", "delete", "spare", "--move-to", "sub")
    assert held["id"] in moved  # type: ignore[index]
    assert alice.json("job", "show", held["id"][:12])["queue"] == "sub"  # type: ignore[index]
    alice.run("job", "cancel", held["id"][:12])  # type: ignore[index]
    assert f"job not found: {job[:6]}zz" in alice.run("job", "show", f"{job[:6]}zz", status=1)


def _drain_and_remove(op: Cli) -> None:
    """The empty node is drained (no new work; `gpupool nodes` says so), then removed: it leaves the list."""
    assert op.json("node", "drain", "gpu-a", "--deadline", "1h", "--dry-run")["work"] == []  # type: ignore[index]
    op.run("node", "drain", "gpu-a", "--deadline", "1h")
    node = next(n for n in op.json("nodes") if n["name"] == "gpu-a")  # type: ignore[union-attr]
    assert node["drain_since"] and node["drain_deadline"]  # type: ignore[index]
    assert "drain" in op.run("nodes")
    op.run("node", "remove", "gpu-a")
    assert "gpu-a" not in [n["name"] for n in op.json("nodes")]  # type: ignore[union-attr]


def _tokens(boss: Cli, alice: Cli) -> None:
    """A tenant admin lists and revokes a user's token; the user is refused at once, in one line."""
    rows = boss.json("token", "list")
    mine = next(t for t in rows if t["user"] == "alice")  # type: ignore[union-attr,index]
    table = boss.run("token", "list")
    assert mine["id"][:12] in table and mine["id"] not in table  # a unique prefix, never cut
    assert mine["id"] in boss.run("token", "list", "--wide")
    assert f"revoked token {mine['id']}" in boss.run("token", "revoke", mine["id"][:12])
    refused = alice.run("whoami", status=1)
    assert refused.startswith("error:") and len(refused.strip().splitlines()) == 1
