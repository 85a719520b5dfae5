"""A second tenant in the dashboard sees only its own jobs and usage.

The operator sets up the organisation globex through the API (project, queue, a tenant admin and its token); the
tenant runs a short job and a long one. The first tenant (organisation "default": projects default and research,
user admin) has a running job, a finished one and usage. Signed in as globex's admin, every page and view of the
dashboard is opened; none of it may name the first tenant's jobs, projects, users, queue or tags, and the browser
may only call the tenant-scoped read endpoints of the API (never one of another tenant's objects, never an
operator's)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import urlsplit

import pytest
from live_dashboard import Live, Tab, expect

pytestmark = pytest.mark.slow

# The first tenant's names, as whole words ("tenant-admin" is a role, not the user admin).
FOREIGN_NAMES = re.compile(r"(?<![\w-])(default|research|admin|vision)(?![\w-])")
READS = re.compile(r"^/api/v1/(whoami|cluster/samples|nodes|top|usage|usage/statement|queues|jobs"
                   r"|budgets|jobs/[0-9a-f]{32}(/events|/why|/logs)?)$")


@pytest.fixture(scope="session")
def first_tenant_running(live: Live) -> dict[str, Any]:
    """A job of the first tenant that holds a GPU while the second tenant looks."""
    job = live.submit(command=["sleep", "60"], name="first-tenant-train")
    return live.wait_job(job["id"], ("running",), timeout_s=20)


@pytest.fixture(scope="session")
def globex(live: Live) -> dict[str, Any]:
    op = live.operator
    live.ok(op.post("/orgs", json={"name": "globex"}), 201)
    live.ok(op.post("/projects", json={"name": "globex-lab", "org": "globex"}), 201)
    live.ok(op.post("/queues", json={"name": "globex-q", "org": "globex", "guaranteed": {"gpus": "2"},
                                     "limit": {"gpus": "4"}}), 201)
    live.ok(op.post("/users", json={"name": "globex-dev", "org": "globex", "role": "tenant-admin",
                                    "projects": ["globex-lab"]}), 201)
    token = live.ok(op.post("/tokens", json={"user": "globex-dev", "org": "globex", "name": "dashboard"}), 201)
    client = live.client(token["token"])
    short = live.submit(client, command=["sh", "-c", "echo globex; sleep 1"], queue="globex-q", name="globex-eval",
                        tags={"team": "globex-ml"})
    long = live.submit(client, command=["sleep", "60"], queue="globex-q", name="globex-train")
    assert live.wait_job(short["id"])["state"] == "succeeded"
    live.wait_metered(short["id"])
    live.wait_job(long["id"], ("running",), timeout_s=20)
    return {"token": token["token"], "jobs": [short["id"], long["id"]], "short": short["id"], "long": long["id"]}


def _foreign_ids(live: Live, globex: dict[str, Any]) -> set[str]:
    """Every job id of the first tenant, and the 12-character prefix the pages show."""
    jobs = live.ok(live.operator.get("/jobs", params={"limit": 500}))["items"]
    ids = {j["id"] for j in jobs if j["project"] != "globex-lab"}
    assert ids and not ids & set(globex["jobs"])
    return ids | {i[:12] for i in ids}


def _assert_clean(tab: Tab, foreign: set[str], where: str) -> None:
    """Nothing of the first tenant in the page: text, tooltips (SVG <title>, title=) and attributes."""
    tab.settle()
    html = tab.page.evaluate("document.getElementById('top-bar').outerHTML + document.getElementById('view').outerHTML")
    leaked = sorted(i for i in foreign if i in html)
    assert not leaked, f"{where}: the first tenant's job ids {leaked} appear"
    names = sorted(set(FOREIGN_NAMES.findall(html)))
    assert not names, f"{where}: the first tenant's names {names} appear"


def test_a_tenant_sees_only_its_own_jobs_and_usage(tab: Tab, live: Live, research: dict[str, Any],
                                                   first_tenant_running: dict[str, Any],
                                                   globex: dict[str, Any]) -> None:
    foreign = _foreign_ids(live, globex)
    tab.login(globex["token"])
    expect(tab.page.locator("#whoami")).to_have_text("globex-dev @ globex tenant-admin")
    _cluster_pages(tab, foreign, first_tenant_running)
    _job_pages(tab, foreign, globex, first_tenant_running)
    _showback_pages(tab, foreign, globex)
    _assert_only_tenant_reads(tab, live, first_tenant_running["id"])
    assert not tab.script_errors(), tab.errors


def _cluster_pages(tab: Tab, foreign: set[str], running: dict[str, Any]) -> None:
    page = tab.page
    tab.go("overview")
    expect(page.locator("#total-gpus .tile-value")).to_have_text("6")
    _assert_clean(tab, foreign, "overview")
    tab.shot("tenant-overview")

    tab.go("heatmap")  # the cluster's GPUs, with the first tenant's allocations shown as allocated, nameless
    [allocation] = running["allocations"]
    held = page.locator(f'.cell[data-node="{allocation["node"]}"][data-gpu="{allocation["gpus"][0]["index"]}"]')
    expect(held).to_have_class(re.compile(r"\ballocated\b"))
    for mode in ("allocated", "utilization", "temperature"):
        page.click(f'#heatmap .segmented button[data-value="{mode}"]')
        _assert_clean(tab, foreign, f"heatmap ({mode})")
    tab.shot("tenant-heatmap")

    tab.go("queues")
    expect(page.locator("#queues tbody tr")).to_have_count(1)
    expect(page.locator('#queues tr[data-queue="globex-q"] svg.quota-bar line.limit')).to_have_count(1)
    _assert_clean(tab, foreign, "queues")
    tab.shot("tenant-queues")

    tab.go("nodes")
    expect(page.locator("#nodes tbody tr")).to_have_count(2)
    expect(page.locator("#nodes button[data-action]")).to_have_count(0)  # operators only
    _assert_clean(tab, foreign, "nodes")
    tab.shot("tenant-nodes")


def _job_pages(tab: Tab, foreign: set[str], globex: dict[str, Any], running: dict[str, Any]) -> None:
    page = tab.page
    tab.go("usage")
    expect(page.locator(f'#top tr[data-job="{globex["long"]}"]')).to_be_visible()
    expect(page.locator("#top tbody tr")).to_have_count(1)
    expect(page.locator('#hours-by-project .bar[data-key="globex-lab"]')).to_have_count(1)
    expect(page.locator("#hours-by-project .bar")).to_have_count(1)
    _assert_clean(tab, foreign, "who uses what")
    tab.shot("tenant-usage")

    for state in ("", "running", "succeeded", "pending", "cancelled"):
        tab.go(f"jobs?state={state}" if state else "jobs")
        _assert_clean(tab, foreign, f"jobs ({state or 'all'})")
        if not state:
            expect(page.locator("#jobs tbody tr")).to_have_count(2)
            tab.shot("tenant-jobs")

    tab.go(f"jobs/{globex['short']}")
    expect(page.locator("#log")).to_have_text("globex\n")
    _assert_clean(tab, foreign, "own job")
    tab.go(f"jobs/{globex['long']}")
    expect(page.locator("#cancel-job")).to_be_visible()
    _assert_clean(tab, foreign, "own running job")
    tab.shot("tenant-job")

    tab.go(f"jobs/{running['id']}")  # typed by hand: the API says it does not exist
    expect(page.locator("#job .error")).to_have_text("404 job not found")
    _assert_clean(tab, foreign - {running["id"], running["id"][:12]}, "foreign job")


def _showback_pages(tab: Tab, foreign: set[str], globex: dict[str, Any]) -> None:
    page = tab.page
    for by in ("project", "user", "queue", "model", "job", "tag&tag=team"):
        tab.go(f"showback?by={by}")
        expect(page.locator("#showback tbody tr").first).to_be_visible()
        _assert_clean(tab, foreign, f"showback by {by}")
    tab.go("showback?by=project")
    expect(page.locator("#showback tbody tr")).to_have_count(1)
    page.click('#showback a.statement-link[data-project="globex-lab"]')
    statement = page.frame_locator("#statement")
    expect(statement.locator("table")).to_contain_text(globex["short"])
    assert not any(i in statement.locator("body").inner_text() for i in foreign)
    _assert_clean(tab, foreign, "statement")
    tab.shot("tenant-showback")


def _assert_only_tenant_reads(tab: Tab, live: Live, probed: str) -> None:
    """The browser called only this server's tenant-scoped read endpoints (and, signing in, opened its session);
    only the probed foreign job answered 404."""
    api = [(method, urlsplit(url).path) for method, url, _ in tab.requests if urlsplit(url).path.startswith("/api/")]
    assert api, "no API calls recorded"
    assert all(url.startswith(live.url) for _, url, _ in tab.requests)
    assert api.count(("POST", "/api/v1/sessions")) == 1
    odd = [(m, p) for m, p in api if (m != "GET" or not READS.match(p)) and (m, p) != ("POST", "/api/v1/sessions")]
    assert not odd, f"calls outside the tenant's read endpoints: {odd}"
    wrong = [(s, u) for s, u in tab.failures if not (s == 404 and probed in u)]
    assert not wrong, f"refused calls: {wrong}"
