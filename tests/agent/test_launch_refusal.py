"""An agent given an order it cannot launch answers it and keeps its channel (issue 41, finding 4): the launch order's
own rules (gpupool.protocol.launch, as at the API), the answer to a signed order that breaks them, to a forged one,
to one the runtime cannot start (a real ProcessRuntime, and the failpoint `agent.launch`), and to the same order
re-sent. The end-to-end test with a real control plane and agent is tests/reliability/test_launch_inputs.py."""

from __future__ import annotations

import os
import random
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from pydantic import ValidationError

from gpupool.agent.channel import Channel, ChannelConfig
from gpupool.agent.clock import ManualClock
from gpupool.agent.devices import FakeDiscovery
from gpupool.agent.failpoints import ENV, FailpointError, Failpoints
from gpupool.agent.orders import launch_problem
from gpupool.agent.outbox import Outbox
from gpupool.agent.runtime import ProcessRuntime
from gpupool.agent.runtime.process import DEFAULT_PATH
from gpupool.agent.workloads import Workloads
from gpupool.protocol.agent import Launch, TaskStatus
from gpupool.protocol.launch import MAX_ITEM_BYTES
from gpupool.protocol.signing import OrderSigner

NOW = 1_700_000_000.0
NODE = "node-1"
SIGNER = OrderSigner.generate()
SECRET = "s3cr3t-value"
ORDER: dict[str, Any] = {"allocation_id": "a1", "attempt": 0, "job_id": "j", "task_index": 0,
                         "command": ["sh", "-c", "exit 0"], "env": {}, "workdir": None, "image": None, "gpus": [],
                         "epoch": 1, "expires_at": NOW + 60}
BROKEN: dict[str, tuple[dict[str, Any], str]] = {  # what breaks the order -> the field the answer names
    "command": ({"command": ["tr\x00ue"]}, "command[0]"),
    "argument": ({"command": ["sh", "-c", "echo\x00"]}, "command[2]"),
    "env name": ({"env": {"A-B": "1"}}, "env[name A-B]"),
    "env value": ({"env": {"TOKEN": SECRET + "\x00"}}, "env.TOKEN"),
    "long value": ({"env": {"BIG": "x" * (MAX_ITEM_BYTES + 1)}}, "env.BIG"),
    "workdir": ({"workdir": "tmp"}, "workdir"),
    "image": ({"image": "alpine\x00"}, "image"),
}


def signed(signer: OrderSigner = SIGNER, node: str = NODE, **fields: Any) -> str:
    """A launch frame as the control plane sends it, signed, with `fields` as given (not validated)."""
    return signer.seal(Launch.model_construct(**{**ORDER, **fields}), node).model_dump_json()


@pytest.fixture
def channel(tmp_path: Path) -> Iterator[Channel]:
    runtime = ProcessRuntime(tmp_path / "workloads", base_env={"PATH": os.environ.get("PATH", DEFAULT_PATH)})
    config = ChannelConfig(server_url="http://cp:8080", credential="cred", boot_id="b1", node_id=NODE,
                           order_key=SIGNER.public_key)
    made = Channel(config, runtime, FakeDiscovery("1xH100", node="n1"), clock=ManualClock(0.0),
                   wall_clock=ManualClock(NOW), rng=random.Random(1))
    yield made
    for handle in runtime.adopt():
        if runtime.is_alive(handle):
            os.killpg(handle.pgid, signal.SIGKILL)


def statuses(channel: Channel) -> list[tuple[str, str]]:
    return [(f.state, f.message) for f in channel.outbox.take() if isinstance(f, TaskStatus)]


@pytest.mark.parametrize("case", list(BROKEN))
def test_the_launch_order_follows_the_apis_rules(case: str) -> None:
    with pytest.raises(ValidationError):
        Launch.model_validate({**ORDER, **BROKEN[case][0]})


def test_the_launch_order_takes_what_the_control_plane_adds() -> None:
    order = Launch.model_validate({**ORDER, "env": {"GPUPOOL_TASK_INDEX": "0", "lower_case": "\u00e9\n"},
                                   "workdir": "/srv/work"})
    assert order.env["GPUPOOL_TASK_INDEX"] == "0"


@pytest.mark.parametrize("case", list(BROKEN))
def test_a_signed_order_that_breaks_the_rules_is_answered_failed_naming_the_field(channel: Channel, tmp_path: Path,
                                                                                 case: str) -> None:
    fields, named = BROKEN[case]
    channel.handle_frame(signed(**fields))  # before: ignored unanswered, the job held its GPUs
    [(state, message)] = statuses(channel)
    assert state == "failed"
    assert message.startswith(f"invalid launch order: {named}:"), message
    assert SECRET not in message
    assert not list((tmp_path / "workloads").glob("*"))  # nothing started


def test_the_same_invalid_order_re_sent_gets_the_same_answer(channel: Channel) -> None:
    frame = signed(command=["tr\x00ue"])
    channel.handle_frame(frame)
    first = statuses(channel)
    channel.handle_frame(frame)  # after a reconnect
    assert statuses(channel) == first


@pytest.mark.parametrize(("frame", "why"), [
    (signed(signer=OrderSigner.generate(), command=["tr\x00ue"]), "bad signature"),
    (signed(node="node-2", command=["tr\x00ue"]), "order for node node-2"),
    (signed(command=["tr\x00ue"]).replace('"type":"launch"', '"type":"launch","extra":1'),
     "not a launch order's fields"),
], ids=["other-key", "other-node", "added-field"])
def test_an_invalid_order_not_signed_for_this_node_is_refused(channel: Channel, frame: str, why: str) -> None:
    """Refused (the control plane requeues the job) rather than failed: a relay must not fail a job by breaking
    its order."""
    channel.handle_frame(frame)
    [(state, message)] = statuses(channel)
    assert state == "refused" and why in message, message


@pytest.mark.parametrize("key", ['"allocation_id":"' + "a" * 65 + '","attempt":0', '"allocation_id":"a1","attempt":-1',
                                 '"allocation_id":"a1","attempt":true', '"allocation_id":7,"attempt":0'],
                         ids=["long-id", "negative-attempt", "bool-attempt", "numeric-id"])
def test_an_invalid_order_whose_key_a_status_cannot_name_is_only_logged(channel: Channel, key: str) -> None:
    channel.handle_frame(signed(command=["tr\x00ue"]).replace('"allocation_id":"a1","attempt":0', key))
    assert statuses(channel) == []


def workloads(tmp_path: Path, failpoints: Failpoints | None = None) -> tuple[Workloads, Outbox]:
    outbox = Outbox("b1")
    runtime = ProcessRuntime(tmp_path / "workloads", base_env={"PATH": os.environ.get("PATH", DEFAULT_PATH)})
    return Workloads(runtime, outbox, wall_clock=ManualClock(NOW), failpoints=failpoints), outbox


def test_a_launch_the_runtime_refuses_is_answered_failed_and_never_retried(tmp_path: Path) -> None:
    """A NUL in the env of an order from a control plane that did not check it (built here unvalidated): exec's own
    ValueError used to escape the channel's reader, drop the connection and come back with every reconnect; the
    runtime now refuses it, naming the variable."""
    node, outbox = workloads(tmp_path)
    order = Launch.model_construct(**{**ORDER, "env": {"FOO": "a\x00b"}})
    node.on_launch(order)
    node.on_launch(order)  # re-sent after a reconnect
    answers = [(f.state, f.message) for f in outbox.take() if isinstance(f, TaskStatus)]
    assert answers == [("failed", "cannot launch: env 'FOO': embedded null byte")] * 2


def test_the_launch_failpoint_fails_the_armed_hit_only(tmp_path: Path) -> None:
    node, outbox = workloads(tmp_path, Failpoints.from_env({ENV: "agent.launch=error@1"}))
    first, second = (Launch.model_validate({**ORDER, "allocation_id": a}) for a in ("a1", "a2"))
    node.on_launch(first)
    node.on_launch(first)
    node.on_launch(second)
    answers = [(f.allocation_id, f.state, f.message) for f in outbox.take() if isinstance(f, TaskStatus)]
    failed = ("a1", "failed", "cannot launch: FailpointError: failpoint agent.launch: injected error (hit 1)")
    assert answers == [failed, failed, ("a2", "started", "")]


@pytest.mark.parametrize(("spec", "failing"), [("", []), (" agent.launch=error ", [1, 2, 3, 4]),
                                               ("agent.launch=error@3", [3])], ids=["unarmed", "every", "third"])
def test_failpoints_are_armed_from_the_environment(spec: str, failing: list[int]) -> None:
    points = Failpoints.from_env({ENV: spec})
    failed = []
    for hit in range(1, 5):
        try:
            points.hit("agent.launch")
        except FailpointError as exc:
            assert f"hit {hit}" in str(exc)
            failed.append(hit)
    assert failed == failing


@pytest.mark.parametrize(("spec", "said"), [("agent.lunch=error", "unknown failpoint 'agent.lunch'"),
                                            ("agent.launch=crash", "bad entry"), ("agent.launch=error@0", "bad entry")])
def test_a_malformed_failpoint_is_refused_naming_it(spec: str, said: str) -> None:
    with pytest.raises(ValueError, match=ENV) as caught:
        Failpoints.from_env({ENV: spec})
    assert said in str(caught.value)


def test_launch_problem_names_each_field_and_quotes_no_value() -> None:
    said = launch_problem({**ORDER, "command": ["a", "b\x00"], "env": {"A.B": "1", "K": SECRET + "\x00"}})
    assert said.startswith("command[1]: must not contain a NUL character; env[name A.B]: is not a variable name")
    assert "env.K: must not contain a NUL" in said
    assert SECRET not in said
    assert launch_problem(ORDER) == ""
