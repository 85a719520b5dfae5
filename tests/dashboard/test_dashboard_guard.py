"""Issue 41, findings 20 and 21, where a browser or agents are needed: "Log out" revokes the tab's session token (the
pasted token never stays in the tab), no page shows text taken from its URL, and /metrics fills the per-queue
allocated and used gauges from a real agent's running job. Parts of the S16 figure line (tests/conftest.py)."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from live_dashboard import Live, Tab, expect

from gpupool.devtools.harness import wait_for

pytestmark = pytest.mark.slow

PHISH = "Your account is locked: call +1 555 0100 now"


def _stored_token(tab: Tab) -> str | None:
    return tab.page.evaluate("sessionStorage.getItem('gpupool.token')")  # type: ignore[no-any-return]


def test_log_out_revokes_the_tabs_session_token(tab: Tab, live: Live, s16: Any) -> None:
    pasted = live.ok(live.operator.post("/tokens", json={"name": "pasted into the dashboard"}), 201)["token"]
    tab.login(pasted)
    stored = _stored_token(tab)
    session_works = httpx.get(f"{live.url}/api/v1/whoami", headers={"Authorization": f"Bearer {stored}"})
    tab.page.click("#logout")
    expect(tab.page.locator("#token")).to_be_visible()
    after = httpx.get(f"{live.url}/api/v1/whoami", headers={"Authorization": f"Bearer {stored}"})
    with s16.part("logout") as numbers:
        numbers["token_after_logout"] = after.status_code
        assert stored and stored != pasted  # the tab holds a session token, never the pasted one
        assert session_works.status_code == 200
        assert after.status_code == 401, after.text
        assert _stored_token(tab) is None
    assert live.client(pasted).get("/whoami").status_code == 200  # logging out ends the session, not the token
    assert not tab.script_errors(), tab.errors


def _shown(tab: Tab) -> str:
    """What the page shows a person: its text, its title, and the values of its inputs."""
    inputs = tab.page.evaluate("[...document.querySelectorAll('input')].map((i) => i.value).join(' ')")
    return f"{tab.page.title()} {tab.page.locator('body').inner_text()} {inputs}"


def test_no_page_shows_text_taken_from_its_url(tab: Tab, live: Live) -> None:
    tab.go(f"login?message={quote(PHISH)}")
    expect(tab.page.locator("#token")).to_be_visible()
    assert "call +1 555" not in _shown(tab)
    tab.login(live.server.token)
    for route in (f"jobs/{quote(PHISH)}", f"showback?by=tag&tag={quote(PHISH)}&from={quote(PHISH)}&to=x",
                  f"login?message={quote(PHISH)}"):
        tab.go(route)
        tab.page.wait_for_timeout(300)
        tab.settle()
        assert "call +1 555" not in _shown(tab), route


def _metric(page: str, name: str, queue: str) -> float | None:
    found = re.search(rf'^{name}\{{org="[^"]*",queue="{re.escape(queue)}"\}} (\S+)$', page, re.MULTILINE)
    return float(found.group(1)) if found else None


def test_the_queue_gauges_follow_a_running_job(live: Live, sleeper: dict[str, Any], s16: Any) -> None:
    def scraped() -> tuple[float | None, float | None]:
        response = httpx.get(f"{live.url}/metrics", headers=live.operator.headers)
        assert response.status_code == 200, response.text
        page = response.text
        return _metric(page, "gpupool_queue_allocated_gpus", "default"), _metric(page, "gpupool_queue_used_gpus",
                                                                                   "default")
    with s16.part("queue_gauges_allocated") as numbers:
        allocated, used = wait_for(lambda: (s := scraped())[0] and s, 30, "the allocated gauge of queue default")
        numbers.update(allocated=allocated, used=used)
        assert allocated >= 1 and used is not None and 0 <= used <= allocated
