"""ServerClock: the control plane's wall clock as an agent with a skewed clock estimates it (RELIABILITY.md T4)."""

from __future__ import annotations

from datetime import UTC, datetime
from email.utils import format_datetime

import pytest

from gpupool.agent.clock import ManualClock, ServerClock, WallClock

SERVER_NOW = 1_800_000_000.0


def date_header(at: float) -> str:
    return format_datetime(datetime.fromtimestamp(at, UTC), usegmt=True)


def test_it_is_the_local_clock_until_synced():
    local = ManualClock(SERVER_NOW + 600)
    assert ServerClock(local).now() == SERVER_NOW + 600


@pytest.mark.parametrize("skew_s", [-3600.0, -600.0, 0.0, 600.0, 3600.0])
def test_synced_it_never_runs_behind_the_server_and_at_most_a_second_ahead(skew_s: float):
    local = ManualClock(SERVER_NOW + 0.7 + skew_s)  # the server's Date header drops the 0.7 s
    clock = ServerClock(local)
    clock.sync(date_header(SERVER_NOW + 0.7))
    assert SERVER_NOW + 0.7 <= clock.now() <= SERVER_NOW + 1.7
    local.advance(5)
    assert SERVER_NOW + 5.7 <= clock.now() <= SERVER_NOW + 6.7


@pytest.mark.parametrize("header", [None, "", "yesterday", "Sun, 99 Nov 2026 99:99:99 GMT"])
def test_an_unusable_header_changes_nothing(header: str | None):
    clock = ServerClock(ManualClock(SERVER_NOW))
    clock.sync(header)
    assert clock.now() == SERVER_NOW


def test_wall_clock_skew_is_injectable():
    assert abs(WallClock(600).now() - WallClock().now() - 600) < 1
