"""The dashboard for an operator's morning (issue 43, item 5), against a live control plane with two agents of fake
GPUs: approving and denying from the overview (and who gets the buttons), what waits and for how long, nodes needing
attention, budgets and their burn, the rates named in words, the queue tree drawn by parent, short copyable ids, sites
only where set. The last test renders every page for the docs; with GPUPOOL_SCREENSHOTS=1 it writes their pictures
into docs/dashboard/ (shown by docs/dashboard.md)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from typing import Any

import pytest
from live_dashboard import Live, Tab, expect

pytestmark = pytest.mark.slow

#: a queue whose jobs above half a GPU wait for a project admin, and whose limit of no GPU keeps an approved job
#: pending (so that the pending count holds still while the test reads it)
GATED = "gated"


@pytest.fixture(scope="module")
def gated(live: Live) -> str:
    live.ok(live.operator.post("/queues", json={"name": GATED, "org": "default", "approval_above_gpus": "0.5",
                                                "limit": {"gpus": "0"}}), 201)
    return GATED


@pytest.fixture(scope="module")
def member_token(live: Live) -> str:
    """A member of project default: may submit and cancel, may not approve."""
    live.ok(live.operator.post("/users", json={"name": "dana", "role": "member", "projects": ["default"]}), 201)
    return str(live.ok(live.operator.post("/tokens", json={"user": "dana", "name": "dashboard"}), 201)["token"])


def _pending_total(live: Live) -> int:
    return sum(q["pending_jobs"] for q in live.ok(live.operator.get("/queues")))


def _awaiting(live: Live, name: str, client: Any = None) -> dict[str, Any]:
    job = live.submit(client, command=["true"], queue=GATED, name=name)
    assert job["state"] == "pending_approval", job
    return job


def test_approving_from_the_overview_moves_the_job_to_pending_and_the_pending_count_follows(
        tab: Tab, live: Live, gated: str) -> None:
    approved, denied = _awaiting(live, "wants-approval"), _awaiting(live, "will-be-denied")
    tab.login(live.server.token)
    page = tab.page
    tab.go("overview")
    tab.settle()
    count = page.locator("#pending-count .tile-value")
    before = _pending_total(live)
    expect(count).to_have_text(str(before))

    row = page.locator(f'#approvals tr[data-job="{approved["id"]}"]')
    row.locator('button[data-action="approve"]').click()
    expect(row).to_have_count(0)
    expect(count).to_have_text(str(before + 1))
    assert live.job(approved["id"])["state"] == "pending"
    assert "approved" in [e["kind"] for e in live.ok(live.operator.get(f"/jobs/{approved['id']}/events"))]
    expect(page.locator(f'#waiting tr[data-queue="{gated}"]')).to_be_visible()
    expect(page.locator("#oldest-wait .tile-note")).to_contain_text("queue ")

    row = page.locator(f'#approvals tr[data-job="{denied["id"]}"]')
    deny = row.locator('button[data-action="deny"]')
    deny.click()
    expect(deny).to_have_text("Click again to deny")  # denying ends the job: a second click confirms
    assert live.job(denied["id"])["state"] == "pending_approval"
    deny.click()
    expect(row).to_have_count(0)
    assert live.job(denied["id"])["state"] == "denied"
    expect(count).to_have_text(str(before + 1))

    for tile, words, spelled in (("gar", "GPUs allocated (GAR)", "GPU allocation rate"),
                                 ("sor", "GPUs allocated or held (SOR)", "scheduling occupancy rate"),
                                 ("gfr", "Nodes partly allocated (GFR)", "GPU fragmentation rate")):
        label = page.locator(f"#total-{tile} .tile-label")
        expect(label).to_have_text(words)
        expect(label).to_have_attribute("title", re.compile(f"^{tile.upper()}, the {spelled}"))
    assert not tab.script_errors(), tab.errors


def test_only_those_allowed_to_decide_see_approve_and_deny(tab: Tab, live: Live, gated: str,
                                                          member_token: str) -> None:
    job = _awaiting(live, "member-asks", live.client(member_token))
    page = tab.page
    tab.login(member_token)
    tab.go("overview")
    expect(page.locator(f'#approvals tr[data-job="{job["id"]}"]')).to_be_visible()
    expect(page.locator("#approvals button[data-action]")).to_have_count(0)
    tab.go(f"jobs/{job['id']}")
    expect(page.locator("#cancel-job")).to_be_visible()  # a member may cancel its job, not approve it
    expect(page.locator("#job button[data-action]")).to_have_count(0)
    page.click("#logout")
    expect(page).to_have_url(re.compile(r"#/login$"))  # signed out (the session revoked) before signing in again

    tab.login(live.server.token)  # an operator approves from the job's page
    tab.go(f"jobs/{job['id']}")
    page.locator('#job button[data-action="approve"]').click()
    expect(page.locator('#job dd[data-field="state"]')).to_have_text("pending")
    expect(page.locator("#job button[data-action]")).to_have_count(0)
    assert live.job(job["id"])["state"] == "pending"
    assert not tab.script_errors(), tab.errors


def test_a_cordoned_node_needs_attention_until_uncordoned(tab: Tab, live: Live) -> None:
    tab.login(live.server.token)
    page = tab.page
    tab.go("overview")
    ready = page.locator("#nodes-ready .tile-value")
    expect(ready).to_have_text("2 / 2")
    expect(page.locator("#attention tbody tr")).to_have_count(0)
    live.ok(live.operator.post("/nodes/node-b/cordon"))
    try:
        page.click("#attention button[aria-label=Reload]")
        expect(ready).to_have_text("1 / 2")
        expect(page.locator("#nodes-ready .tile-note")).to_have_text("1 cordoned")
        expect(page.locator('#attention tr[data-node="node-b"] .badge')).to_have_text("cordoned")
    finally:
        live.ok(live.operator.post("/nodes/node-b/uncordon"))
    page.click("#attention button[aria-label=Reload]")
    expect(ready).to_have_text("2 / 2")
    assert not tab.script_errors(), tab.errors


def test_the_queue_tree_is_drawn_by_parent(tab: Tab, live: Live) -> None:
    """Issue 43: child `sub` of `vision` was drawn under `nlp`, the queue before it by name."""
    for body in ({"name": "cv"}, {"name": "nlp"}, {"name": "sub", "parent": "cv"}, {"name": "deep", "parent": "sub"},
                 {"name": "ab", "parent": "nlp"}):
        live.ok(live.operator.post("/queues", json={**body, "org": "default"}), 201)  # not shared with tenants
    tab.login(live.server.token)
    tab.go("queues")
    page = tab.page
    expect(page.locator('#queues tr[data-queue="deep"]')).to_be_visible()
    rows = [(r.get_attribute("data-queue"), int(r.get_attribute("data-depth")))
            for r in page.locator("#queues tbody tr").all()]
    parents = {q["name"]: q["parent"] for q in live.ok(live.operator.get("/queues"))}
    assert sorted(name for name, _ in rows) == sorted(parents)
    path: list[str] = []  # the ancestors of the row being read
    for name, depth in rows:
        assert depth <= len(path), (name, rows)
        del path[depth:]
        assert (path[-1] if path else None) == parents[name], (name, path, rows)
        path.append(name)
    names = [name for name, _ in rows]
    assert names.index("cv") < names.index("sub") < names.index("deep") < names.index("nlp") < names.index("ab")
    expect(page.locator('#queues tr[data-queue="sub"] td').first).to_have_text("└ sub")
    assert not tab.script_errors(), tab.errors


def test_ids_are_short_with_the_whole_id_to_copy_and_sites_show_only_where_set(tab: Tab, live: Live,
                                                                              research: dict[str, Any]) -> None:
    job_id = research["id"]
    tab.page.context.grant_permissions(["clipboard-read", "clipboard-write"], origin=live.url)
    tab.login(live.server.token)
    tab.go("jobs")
    page = tab.page
    ref = page.locator(f'#jobs tr[data-job="{job_id}"] .id-ref')
    expect(ref.locator(".id")).to_have_text(job_id[:12])
    expect(ref.locator(".id")).to_have_attribute("title", job_id)
    ref.locator("button.copy").click()
    expect(ref.locator("button.copy")).to_have_text("copied")
    assert page.evaluate("navigator.clipboard.readText()") == job_id

    tab.go(f"jobs/{job_id}")
    expect(page.locator("h1 .id")).to_have_text(job_id[:12])
    expect(page.locator('#job dd[data-field="id"] .id')).to_have_attribute("title", job_id)

    assert not any(n["site"] for n in live.ok(live.operator.get("/nodes")))  # the agents name no site
    tab.go("nodes")
    expect(page.locator('#nodes tr[data-node="node-a"]')).to_be_visible()
    expect(page.locator("#nodes th", has_text="site")).to_have_count(0)
    tab.go("heatmap")
    expect(page.locator(".node-card")).to_have_count(2)
    expect(page.locator("#heatmap .site h3")).to_have_count(0)
    assert not tab.script_errors(), tab.errors


def _module(tab: Tab, path: str, call: str, arg: Any) -> Any:
    """The JavaScript expression `call` of `m` (the dashboard's module `path`) and `arg`, evaluated in the page."""
    return tab.page.evaluate(f"async (arg) => {{ const m = await import('/js/{path}'); return {call}; }}", arg)


def test_trees_sites_and_burn_on_made_up_data(tab: Tab, live: Live) -> None:
    """What a live pool of one organisation and no sites cannot show: queues of the same name in two organisations and
    under a shared parent, nodes with and without a site, a budget's pace."""
    tab.go("login")
    expect(tab.page.locator("#token")).to_be_visible()
    queues = [{"name": n, "org": o, "parent": p} for n, o, p in (
        ("vision", "y", None), ("sub", "y", "vision"), ("nlp", "x", None), ("sub", "x", "vision"),
        ("team", "x", "pool"), ("vision", "x", None), ("pool", None, None))]
    order = _module(tab, "pages/queues.js", "m.treeOrder(arg).map((q) => [q.name, q.org, q.depth])", queues)
    assert order == [["nlp", "x", 0], ["pool", None, 0], ["team", "x", 1], ["vision", "y", 0], ["sub", "y", 1],
                     ["vision", "x", 0], ["sub", "x", 1]]
    headings = "m.siteGroups(arg).map((g) => [g.heading, g.members.map((n) => n.name)])"
    mixed = [{"name": "a", "site": ""}, {"name": "b", "site": "lab"}, {"name": "c", "site": ""}]
    assert _module(tab, "pages/heatmap.js", headings, mixed) == [["site lab", ["b"]],
                                                                  ["nodes without a site", ["a", "c"]]]
    assert _module(tab, "pages/heatmap.js", headings, [{"name": "a", "site": ""}]) == [[None, ["a"]]]
    budget = {"gpu_hours": 10, "cents": None, "used_gpu_hours": 2.5, "used_cents": 0,
              "period_start": "2026-12-01T00:00:00", "period_end": "2026-12-05T00:00:00"}
    burn = _module(tab, "panels/budgets.js", "m.burn(arg, Date.parse('2026-12-02T00:00:00Z'))", budget)
    assert burn == {"used": 2.5, "limit": 10, "unit": "GPU-hours", "fraction": 0.25, "elapsed": 0.25, "pace": 1}
    assert not tab.script_errors(), tab.errors


def test_the_cli_accepts_the_short_id_the_dashboard_shows(live: Live, research: dict[str, Any]) -> None:
    env = {**os.environ, "GPUPOOL_URL": live.url, "GPUPOOL_TOKEN": live.server.token}
    shown = subprocess.run([sys.executable, "-m", "gpupool.cli.main", "job", "show", research["id"][:12]], env=env,
                           capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stdout + shown.stderr
    assert research["id"] in shown.stdout


def _budgets(live: Live) -> None:
    """A soft budget per period kind, one nearly used up; they stop nothing (other tests share this server)."""
    for body in ({"scope": "project", "name": "default", "gpu_hours": 40, "period": "month"},
                 {"scope": "project", "name": "research", "gpu_hours": 0.0001, "period": "week"},
                 {"scope": "queue", "name": GATED, "cents": 5000, "period": "day"}):
        live.ok(live.operator.post("/budgets", json={**body, "hard": False}), 201)


def test_every_page_renders_for_the_docs(tab: Tab, live: Live, gated: str, research: dict[str, Any]) -> None:
    """Each page once, checked; their pictures for docs/dashboard.md when GPUPOOL_SCREENSHOTS=1."""
    _budgets(live)
    _awaiting(live, "big-finetune")
    running = live.submit(command=["sleep", "30"], name="train-resnet")
    live.wait_job(running["id"], ("running",), timeout_s=20)
    page = tab.page
    tab.go("login")
    expect(page.locator("#token")).to_be_visible()
    tab.doc_shot("login")
    tab.login(live.server.token)
    checks = {
        "overview": "#budgets tr[data-budget='project/research'][data-exceeded='true']",
        "heatmap": ".cell.allocated",
        "usage": f'#top tr[data-job="{running["id"]}"]',
        "queues": f'#queues tr[data-queue="{gated}"]',
        "jobs": f'#jobs tr[data-job="{running["id"]}"]',
        f"jobs/{running['id']}": "#log",
        "nodes": '#nodes tr[data-node="node-b"]',
        "showback": "#showback tbody tr",
    }
    for route, ready in checks.items():
        tab.go(route)
        expect(page.locator(ready).first).to_be_visible()
        tab.settle()
        tab.doc_shot("job" if route.startswith("jobs/") else route)
    tab.go("overview")
    expect(page.locator("#budgets tr[data-budget='project/default']")).to_contain_text("of 40.000 GPU-hours")
    expect(page.locator("#budgets tr[data-budget='project/research']")).to_contain_text("used up")
    assert not tab.script_errors(), tab.errors
