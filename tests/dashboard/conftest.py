"""The dashboard end to end: a real control plane (SQLite) with two real agents of fake GPUs, and headless Chromium
driven by Playwright's sync API. Chromium is Debian's package (`make system-deps`); `playwright install` is never
used. Without Chromium or Playwright the tests skip and say why."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from typing import Any

import pytest
from live_dashboard import (
    AGENTS,
    CHROMIUM,
    CHROMIUM_ARGS,
    SERVER_ENV,
    Live,
    Tab,
    start_agent,
    stop_live,
    wait_for,
)

from gpupool.devtools.harness import start_server

try:
    from playwright.sync_api import expect, sync_playwright

    expect.set_options(timeout=15_000)  # pages poll every 2-10 s, and a loaded test machine is slow
except ImportError:
    sync_playwright = None


@pytest.fixture(scope="session")
def chromium_path() -> str:
    if sync_playwright is None:
        pytest.skip("Playwright is not installed: pip install -e '.[test]'")
    found = next((p for p in CHROMIUM if os.access(p, os.X_OK)), None)
    if found is None:
        pytest.skip("Chromium is not installed: apt-get install -y --no-install-recommends chromium "
                    "(make system-deps); `playwright install` is not used")
    return found


@pytest.fixture(scope="session")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    root = tmp_path_factory.mktemp("dashboard")
    (root / "data").mkdir()
    live = Live(start_server(root / "data", env=SERVER_ENV), root)
    try:
        for name, gpus in AGENTS.items():
            start_agent(live, name, gpus)

        def ready() -> bool:
            for name, process in live.agents.items():
                if process.poll() is not None:
                    log = (live.root / "agents" / name / "agent.log").read_text(errors="replace")
                    raise AssertionError(f"agent {name} exited {process.returncode}:\n{log[-3000:]}")
            nodes = {n["name"]: n for n in live.ok(live.operator.get("/nodes"))}
            return all(nodes.get(n, {}).get("state") == "ready" for n in AGENTS)
        wait_for(ready, 30, "both agents to be ready")
        yield live
    finally:
        stop_live(live)


@pytest.fixture(scope="module")
def browser(chromium_path: str) -> Iterator[Any]:
    """Per module: Playwright's sync API holds an event loop on this thread while it is open, and tests of other
    modules run `asyncio.run` on the same worker."""
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium_path, headless=True, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def tab(browser: Any, live: Live) -> Iterator[Tab]:
    context = browser.new_context(viewport={"width": 1360, "height": 900})
    context.set_default_timeout(15_000)
    page = context.new_page()
    tab = Tab(page, live.url)
    page.on("console", lambda m: m.type == "error" and tab.errors.append(m.text))
    page.on("pageerror", lambda e: tab.errors.append(f"uncaught: {e}"))
    page.on("request", lambda r: tab.requests.append((r.method, r.url, time.monotonic())))
    page.on("response", lambda r: r.status >= 400 and tab.failures.append((r.status, r.url)))
    yield tab
    context.close()


@pytest.fixture
def sleeper(live: Live) -> dict[str, Any]:
    """A one-GPU `sleep 20` job of the operator, running; with the node and GPU index it holds."""
    job = live.submit(command=["sleep", "20"], name="sleeper")
    job = live.wait_job(job["id"], ("running",), timeout_s=20)
    return job


@pytest.fixture(scope="session")
def research(live: Live) -> dict[str, Any]:
    """A short one-GPU job of a second project of the operator's organisation, finished and fully metered."""
    live.ok(live.operator.post("/projects", json={"name": "research"}), 201)
    job = live.submit(command=["sh", "-c", "echo training; sleep 1.5; echo done"], project="research",
                      tags={"team": "vision"}, name="short")
    job = live.wait_job(job["id"])
    assert job["state"] == "succeeded", job
    live.wait_metered(job["id"])
    return job
