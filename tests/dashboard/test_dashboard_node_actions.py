"""The nodes page's drain, undrain and remove buttons (issue 43, item 2), against the live control plane with two
agents: an operator drains a node with a deadline (the page says "draining (deadline …)" and the API has it), undrains
it, is refused (409 naming the job) removing the node a job runs on, and removes an empty node (its row goes); a
viewer sees none of the buttons. Screenshot: artifacts/nodes-draining.png."""

from __future__ import annotations

from typing import Any

import pytest
from live_dashboard import Live, Tab, expect

pytestmark = pytest.mark.slow


def _register_empty(live: Live, name: str) -> None:
    join = live.ok(live.operator.post("/join-tokens", json={}), 201)["token"]
    live.ok(live.operator.post("/agent/register", json={
        "join_token": join, "name": name, "boot_id": "boot", "cpu_milli": 4000, "memory_mib": 4096, "gpus": []}))


def _node(live: Live, name: str) -> dict[str, Any] | None:
    return next((n for n in live.ok(live.operator.get("/nodes")) if n["name"] == name), None)


def test_an_operator_drains_undrains_and_removes_nodes(tab: Tab, live: Live) -> None:
    job = live.wait_job(live.submit(command=["sleep", "120"], name="drained-away")["id"], ("running",), timeout_s=20)
    busy = job["allocations"][0]["node"]
    _register_empty(live, "spare-ui")  # empty for sure: the agents' nodes may run other tests' jobs
    try:
        _drain_and_remove(tab, live, job, busy)
    finally:  # other tests of this live server count its nodes
        if _node(live, "spare-ui") is not None:
            live.operator.delete("/nodes/spare-ui", params={"force": "true"})


def _drain_and_remove(tab: Tab, live: Live, job: dict[str, Any], busy: str) -> None:
    tab.login(live.server.token)
    tab.go("nodes")
    page = tab.page

    row = page.locator(f'#nodes tr[data-node="{busy}"]')
    row.locator(f'select[data-deadline="{busy}"]').select_option("3600")
    row.locator('button[data-action="drain"]').click()
    expect(row.locator(f'[data-drain="{busy}"]')).to_contain_text("draining (deadline")
    expect(row.locator(f'[data-drain="{busy}"]')).to_contain_text("in 59m")
    node = _node(live, busy)
    assert node is not None and node["cordoned"] and node["drain_deadline"], node
    tab.shot("nodes-draining")
    row.locator('button[data-action="undrain"]').click()
    expect(row).to_have_attribute("data-draining", "false")
    assert _node(live, busy)["drain_since"] is None  # type: ignore[index]

    other = page.locator('#nodes tr[data-node="spare-ui"]')
    other.locator('button[data-action="drain"]').click()  # no deadline; nothing runs there
    expect(other.locator('[data-drain="spare-ui"]')).to_have_text("drained")
    other.locator('button[data-action="undrain"]').click()
    expect(other).to_have_attribute("data-draining", "false")

    row.locator('button[data-action="remove"]').click()
    expect(row.locator('button[data-action="remove"]')).to_have_text("Click again to remove")
    row.locator('button[data-action="remove"]').click()
    expect(row.locator("p.error")).to_contain_text(job["id"])
    assert _node(live, busy) is not None

    spare = page.locator('#nodes tr[data-node="spare-ui"]')
    spare.locator('button[data-action="remove"]').click()
    spare.locator('button[data-action="remove"]').click()
    expect(page.locator('#nodes tr[data-node="spare-ui"]')).to_have_count(0)
    assert _node(live, "spare-ui") is None
    live.ok(live.operator.post(f"/jobs/{job['id']}/cancel"))
    assert not tab.script_errors(), tab.errors


def test_a_viewer_sees_no_node_actions(tab: Tab, live: Live) -> None:
    op = live.operator
    live.ok(op.post("/users", json={"name": "watcher", "org": "default", "role": "viewer", "projects": []}), 201)
    token = live.ok(op.post("/tokens", json={"user": "watcher", "org": "default", "name": "ui"}), 201)["token"]
    tab.login(token)
    tab.go("nodes")
    expect(tab.page.locator('#nodes tr[data-node="node-a"]')).to_be_visible()
    expect(tab.page.locator("#nodes button[data-action]")).to_have_count(0)
    expect(tab.page.locator("#nodes select[data-deadline]")).to_have_count(0)
    assert not tab.script_errors(), tab.errors
