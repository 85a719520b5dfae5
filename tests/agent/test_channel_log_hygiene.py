"""The agent never logs the content of a control-plane frame it cannot parse: a launch order carries the job's
secret environment values, so a malformed one (a newer protocol, a broken relay) must leave only its type and size
in the log (RELIABILITY.md §4.2, S6: no secrets in logs)."""

from __future__ import annotations

import json
import logging
import random
from pathlib import Path

import pytest

from gpupool.agent.channel import Channel, ChannelConfig
from gpupool.agent.clock import ManualClock
from gpupool.agent.devices import FakeDiscovery
from gpupool.agent.runtime import ProcessRuntime

SECRET = "s3cr3t-value-that-must-not-be-logged"
LAUNCH = {"type": "launch", "env": {"HF_TOKEN": SECRET}, "allocation_id": "a1", "attempt": 0, "job_id": "j",
          "task_index": 0, "command": ["true"], "epoch": 1, "expires_at": 1.0}


@pytest.fixture
def channel(tmp_path: Path) -> Channel:
    clock = ManualClock(0.0)
    config = ChannelConfig(server_url="http://cp:8080", credential="cred", boot_id="b1", heartbeat_s=0.05,
                           fence_s=40.0, node_id="node-1", order_key="")
    return Channel(config, ProcessRuntime(tmp_path / "workloads"), FakeDiscovery("1xH100", node="n1", clock=clock),
                   clock=clock, wall_clock=ManualClock(1.0), rng=random.Random(1))


@pytest.mark.parametrize(("raw", "want_type"), [
    (json.dumps({**LAUNCH, "type": f"launch {SECRET}"}), "?"),  # the type itself is not a plain word
    (json.dumps([SECRET]), "?"),
    (f"{{not json {SECRET}", "?"),
    (f"{{not json {SECRET}".encode(), "?"),
], ids=["odd-type", "not-an-object", "not-json", "binary"])
def test_a_malformed_frame_is_logged_by_type_and_size_only(channel: Channel, caplog: pytest.LogCaptureFixture,
                                                           raw: str | bytes, want_type: str) -> None:
    with caplog.at_level(logging.DEBUG, logger="gpupool.agent"):
        channel.handle_frame(raw)
    text = "\n".join(r.getMessage() for r in caplog.records)
    assert SECRET not in text
    assert f"malformed frame from the control plane: type {want_type}, {len(raw)} bytes" in text
    assert channel.outbox.take() == []  # nothing applied, nothing answered


@pytest.mark.parametrize(("raw", "answer"), [
    (json.dumps({k: v for k, v in LAUNCH.items() if k != "epoch"}), ["refused"]),  # pydantic quotes the whole order
    (json.dumps({**LAUNCH, "unexpected": SECRET}), ["refused"]),
    (json.dumps({**LAUNCH, "env": {"HF_TOKEN": SECRET + "\x00"}}), ["refused"]),
    (json.dumps({**LAUNCH, "attempt": f"not a number {SECRET}"}), []),  # no (allocation, attempt) to answer
], ids=["missing-field", "extra-field", "nul-in-value", "bad-key"])
def test_a_malformed_launch_order_is_answered_without_its_values(channel: Channel, caplog: pytest.LogCaptureFixture,
                                                                 raw: str, answer: list[str]) -> None:
    """Answered so that the control plane need not hold the GPUs (refused: this agent pins no key, so no order is
    authentic here); neither the log nor the answer quotes a value."""
    with caplog.at_level(logging.DEBUG, logger="gpupool.agent"):
        channel.handle_frame(raw)
    sent = channel.outbox.take()
    assert [getattr(frame, "state", None) for frame in sent] == answer
    assert SECRET not in "\n".join(r.getMessage() for r in caplog.records) + repr(sent)
