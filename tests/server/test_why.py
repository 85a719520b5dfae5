"""`gpupool job why` in the API's words: a time as ISO 8601 UTC and how far from now, the holder named
(gpupool.server.services.jobs.reason_out)."""

from __future__ import annotations

import pytest

from gpupool.core.diagnostics import PendingKind, PendingReason, iso_utc
from gpupool.server.services.jobs import reason_out, relative

AT = 1_796_525_796.0


@pytest.mark.parametrize(("seconds", "want"), [(0.4, "now"), (60, "in 60 s"), (180, "in 3 min"), (-7200, "2 h ago"),
                                               (3 * 86400, "in 3 d")])
def test_relative_times_use_a_sensible_unit(seconds, want):
    assert relative(seconds) == want


def test_a_stored_reason_gives_its_time_as_iso_and_relative_and_names_the_holder():
    stored = PendingReason(PendingKind.RESERVED_FOR, f"the nodes it fits on are reserved for job j1 from {iso_utc(AT)}",
                           at=AT, holder="j1").to_dict()
    out = reason_out(stored, now=AT - 180)
    assert out.message == "the nodes it fits on are reserved for job j1 from 2026-12-06T02:56:36Z, in 3 min"
    assert out.holder == "j1" and out.at is not None and out.at.timestamp() == AT
    assert PendingReason.from_dict(stored) == PendingReason.from_dict(dict(stored))  # round trip


def test_a_reason_without_a_time_is_given_as_stored():
    stored = PendingReason(PendingKind.NO_NODE_FITS, "0/1 nodes can take the task: 1 too few GPUs on node",
                           (("too few GPUs on node", 1),)).to_dict()
    out = reason_out(stored)
    assert out.message == stored["message"] and out.at is None and out.holder is None
    assert out.details == [{"reason": "too few GPUs on node", "nodes": 1}]
