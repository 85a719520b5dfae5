"""The dashboard as an operator sees it, against a live control plane with two agents of fake GPUs: signing in and
out, a running job's GPU on the heatmap, showback equal to the usage API and the ledger, and every page rendering
without a script error. Screenshots of every page go to tests/dashboard/artifacts/."""

from __future__ import annotations

import re
from datetime import date, timedelta
from typing import Any

import httpx
import pytest
from live_dashboard import Live, Tab, expect, wait_for

pytestmark = pytest.mark.slow


def test_sign_in_shows_who_you_are_and_sign_out_forgets_the_token(tab: Tab, live: Live) -> None:
    page = tab.page
    tab.go("overview")
    expect(page).to_have_url(re.compile(r"#/login$"))  # nothing without a token
    expect(page.locator("#nav")).to_be_hidden()
    tab.shot("login")
    page.fill("#token", "gp_0000000000_not-a-real-token")
    page.click("#login button[type=submit]")
    expect(page.locator("#login-message")).to_have_text("That token was refused.")

    tab.login(live.server.token)
    expect(page).to_have_url(re.compile(r"#/overview$"))
    expect(page.locator("#whoami")).to_have_text("admin @ default operator")
    stored = page.evaluate("sessionStorage.getItem('gpupool.token')")
    assert stored.startswith("gp_") and stored != live.server.token  # a session token, not the pasted one
    assert page.evaluate("localStorage.length") == 0  # the token lives in this tab only
    tab.go("login")
    expect(page.locator("#signed-in")).to_contain_text("operator")

    page.click("#logout")
    expect(page).to_have_url(re.compile(r"#/login$"))
    assert page.evaluate("sessionStorage.getItem('gpupool.token')") is None
    tab.go("jobs")
    expect(page).to_have_url(re.compile(r"#/login$"))
    assert not tab.script_errors()


def test_heatmap_shows_the_running_jobs_gpu_allocated(tab: Tab, live: Live, sleeper: dict[str, Any]) -> None:
    [allocation] = sleeper["allocations"]
    node, index = allocation["node"], allocation["gpus"][0]["index"]
    tab.login(live.server.token)
    tab.go("heatmap")
    page = tab.page
    held = page.locator(f'.cell[data-node="{node}"][data-gpu="{index}"]')
    expect(held).to_have_class(re.compile(r"\ballocated\b"))
    expect(held).to_have_attribute("data-allocated-milli", "1000")
    expect(held).to_have_attribute("title", re.compile(f"{node} GPU {index} .*\nallocated: 1 of 1 GPU"))
    cells = page.locator(".cell")
    expect(cells).to_have_count(6)  # 2 + 4 fake GPUs, grouped by node
    expect(page.locator('.node-card[data-node="node-b"] .cell')).to_have_count(4)
    free = page.locator(".cell.free").first
    assert held.evaluate("e => getComputedStyle(e).backgroundColor") != free.evaluate(
        "e => getComputedStyle(e).backgroundColor")
    tab.shot("heatmap-allocated")
    for mode in ("utilization", "temperature"):
        page.click(f'#heatmap .segmented button[data-value="{mode}"]')
        expect(held.locator(".value")).to_have_text(re.compile(r"^\d+(%|°)$"))
        tab.shot(f"heatmap-{mode}")

    tab.go("usage")  # who uses what: the same job, its project and node
    row = page.locator(f'#top tr[data-job="{sleeper["id"]}"]')
    expect(row).to_contain_text(node)
    expect(row).to_contain_text("default")
    tab.shot("usage")
    assert not tab.script_errors()


def test_the_job_page_follows_the_log_by_polling_every_two_seconds(tab: Tab, live: Live) -> None:
    """Lines appear while the job runs, none twice (X-Next-Offset); the end of the job reloads its panels."""
    job = live.submit(command=["sh", "-c", "for i in 1 2 3 4 5 6 7 8; do echo line $i; sleep 0.75; done"],
                      name="ticker")
    page = tab.page
    offsets: list[int] = []  # X-Next-Offset of each log answer
    started: list[float] = []  # when the browser sent each log request (ms)
    page.on("response", lambda r: "/logs?" in r.url and offsets.append(int(r.headers["x-next-offset"])))
    page.on("requestfinished", lambda r: "/logs?" in r.url and started.append(r.timing["startTime"]))
    tab.login(live.server.token)
    live.wait_job(job["id"], ("running",), timeout_s=20)
    tab.go(f"jobs/{job['id']}")
    expect(page.locator('#job dd[data-field="state"]')).to_have_text("succeeded", timeout=30_000)
    expect(page.locator("#log")).to_have_text("".join(f"line {i}\n" for i in range(1, 9)))  # each line once
    expect(page.locator("#events tbody tr")).to_have_count(4)  # reloaded when the log said the job ended
    assert len(set(offsets) - {0}) >= 2, offsets  # the log grew while the page followed it
    gaps = [b - a for a, b in zip(started, started[1:], strict=False)]
    assert gaps and min(gaps) >= 1950, gaps  # never faster than every 2 s
    assert not tab.script_errors()


def _ui_rows(tab: Tab) -> dict[str, tuple[float, str]]:
    """(data value, shown text) of GPU-hours per key of the showback table."""
    rows = tab.page.locator("#showback tbody tr")
    return {r.get_attribute("data-key"): (float(r.get_attribute("data-gpu-hours")), r.locator(".gpu-hours")
            .inner_text()) for r in rows.all()}


def _api_hours(client: httpx.Client, by: str, start: str, end: str) -> dict[str, float]:
    response = client.get("/usage", params={"by": by, "from": start, "to": end})
    assert response.status_code == 200, response.text
    return {r["key"]: r["gpu_hours"] for r in response.json()}


@pytest.mark.parametrize("by", ["project", "user"])
def test_showback_equals_the_usage_api_and_the_ledger(tab: Tab, live: Live, research: dict[str, Any],
                                                      by: str) -> None:
    tab.login(live.server.token)
    tab.go(f"showback?by={by}")
    page = tab.page
    default_from, end = date.fromisoformat(page.input_value("#from")), page.input_value("#to")
    assert date.fromisoformat(end) - default_from == timedelta(days=31)  # the last 30 days and today
    start = (default_from + timedelta(days=1)).isoformat()
    before = _api_hours(live.operator, by, start, end)
    page.fill("#from", start)  # the date picker
    page.click("#showback-form button[type=submit]")
    expect(page.locator("#showback h2")).to_contain_text(f"{start} to {end}")
    expect(page.locator("#showback tbody tr").first).to_be_visible()
    tab.settle()
    shown = _ui_rows(tab)
    after = _api_hours(live.operator, by, start, end)
    ledger = live.ledger_hours(by)
    assert set(shown) == set(after) == set(ledger)
    for key, (value, text) in shown.items():
        # a project with a running job grows between the two API calls; a finished one is equal everywhere
        assert before.get(key, 0) <= value <= after[key], (key, before, shown, after)
        assert text == f"{value:.6f}" if value < 1 else text.startswith(f"{value:.3f}")
    settled = "research" if by == "project" else None
    if settled:
        assert shown[settled][0] == before[settled] == after[settled] == ledger[settled] > 0
        total = research["allocations"][0]
        assert total["released_at"] is not None
    if by == "project":
        link = page.locator('#showback a.statement-link[data-project="research"]')
        month = page.input_value("#month")
        assert link.get_attribute("href") == f"/api/v1/usage/statement?project=research&month={month}&format=html"
        link.click()
        frame = page.frame_locator("#statement")
        expect(frame.locator("h1")).to_have_text(f"Statement: project research, {month}")
        expect(frame.locator("table")).to_contain_text(research["id"])
        tab.shot("showback")
    assert not tab.script_errors()


def test_every_page_renders_without_script_errors(tab: Tab, live: Live, research: dict[str, Any]) -> None:
    tab.login(live.server.token)
    page = tab.page

    tab.go("overview")
    expect(page.locator("#total-gpus .tile-value")).to_have_text("6")
    expect(page.locator("#cluster figure.chart svg.line-chart")).to_have_count(2)
    expect(page.locator("#cluster svg.line-chart path.line").first).to_be_visible()
    assert page.locator("#cluster svg .hover rect title").count() > 1  # tooltips over time
    tab.shot("overview")

    tab.go("queues")
    expect(page.locator('#queues tr[data-queue="default"] svg.quota-bar')).to_be_visible()
    tab.shot("queues")

    tab.go("jobs")
    expect(page.locator(f'#jobs tr[data-job="{research["id"]}"]')).to_contain_text("succeeded")
    page.select_option("#state-filter", "running")
    expect(page).to_have_url(re.compile(r"state=running"))
    expect(page.locator(f'#jobs tr[data-job="{research["id"]}"]')).to_have_count(0)
    tab.shot("jobs")

    tab.go(f"jobs/{research['id']}")
    expect(page.locator('#job dd[data-field="project"]')).to_have_text("research")
    expect(page.locator("#log")).to_have_text("training\ndone\n")
    expect(page.locator("#why-message")).to_contain_text("the job is succeeded")
    expect(page.locator("#events tbody tr")).to_have_count(4)  # submitted, scheduled, running, succeeded
    expect(page.locator("#cancel-job")).to_have_count(0)  # finished: nothing to cancel
    tab.shot("job")

    _cancel_from_the_job_page(tab, live)

    tab.go("nodes")
    row = page.locator('#nodes tr[data-node="node-a"]')
    row.locator('button[data-action="cordon"]').click()
    expect(row.locator('button[data-action="uncordon"]')).to_be_visible()
    assert live.ok(live.operator.get("/nodes"))[0]["cordoned"] is True
    tab.shot("nodes")
    row.locator('button[data-action="uncordon"]').click()
    expect(row.locator('button[data-action="cordon"]')).to_be_visible()
    assert live.ok(live.operator.get("/nodes"))[0]["cordoned"] is False

    outside = [url for _, url, _ in tab.requests if not url.startswith(live.url)]
    assert not outside, f"the dashboard fetched from elsewhere: {outside}"
    assert not tab.script_errors(), tab.errors


def _cancel_from_the_job_page(tab: Tab, live: Live) -> None:
    """A pending job that can never fit (64 GPUs, held by a queue that lets such jobs wait): why it waits, then
    cancel it (two clicks)."""
    live.ok(live.operator.post("/queues", json={"name": "ondemand", "org": "default", "hold_unsatisfiable": True}), 201)
    job = live.submit(command=["true"], gpus="64", name="too-big", queue="ondemand")
    wait_for(lambda: live.ok(live.operator.get(f"/jobs/{job['id']}/why"))["kind"] != "queued", 10, "a reason")
    page = tab.page
    tab.go(f"jobs/{job['id']}")
    expect(page.locator("#why-message")).not_to_contain_text("the job is")
    tab.shot("job-pending")
    page.click("#cancel-job")
    expect(page.locator("#cancel-job")).to_have_text("Click again to cancel")
    page.click("#cancel-job")
    expect(page.locator('#job dd[data-field="state"]')).to_have_text("cancelled")
    assert live.job(job["id"])["state"] == "cancelled"
