"""Checking orders before anything runs (RELIABILITY.md §4.2): signature, node, duplicates, stale epochs, expiry,
devices.

`check_order` and `authenticate` are pure: the caller passes the wall-clock time, the highest epoch seen, what this
node already runs or ran, its node id and the verifier of the control-plane key it pinned. `EpochRecord` keeps the
highest epoch in a file so a restarted agent still refuses stale orders. A launch order that breaks the protocol's
rules (`Launch`, e.g. a NUL in its command) is still read far enough to answer it: `order_key` reads its
(allocation, attempt), `unchecked_launch` gives it as received for `authenticate`, and `launch_problem` says what
is wrong with it without quoting any value (its env may hold secrets).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import TypeAdapter, ValidationError

from gpupool.agent.runtime.base import WorkloadKey
from gpupool.protocol.agent import AllocationId, Attempt, GpuGrant, Launch, Stop
from gpupool.protocol.signing import OrderVerifier

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class OrderCheck:
    """The verdict on one launch order.

    * "launch": start it;
    * "duplicate": this (allocation, attempt) already runs or ran here: start nothing, repeat its status;
    * "refuse": start nothing, answer TaskStatus(state="refused", message=reason).
    """

    action: Literal["launch", "duplicate", "refuse"]
    reason: str = ""


def authenticate(order: Launch | Stop, *, node_id: str | None, verifier: OrderVerifier | None) -> str | None:
    """Why `order` is not an authentic order for this node, or None when it is: refused when `verifier` is given
    and the signature does not verify against the pinned key (a tampered, forged or unsigned order), then when
    `node_id` is given and the order names another node (an order captured on one node and replayed to another).
    None for either argument skips that check (unit tests of other rules; the channel always gives both)."""
    if verifier is not None and not verifier.verify(order):
        pinned = "" if verifier.pinned else " (no control-plane key pinned: register this node again)"
        return f"bad signature: the order is not signed by the pinned control-plane key{pinned}"
    if node_id is not None and order.node_id != node_id:
        return f"order for node {order.node_id or '(none)'}, this is node {node_id}"
    return None


def check_order(
    order: Launch,
    *,
    now: float,
    highest_epoch: int,
    known: Collection[WorkloadKey] = (),
    gpu_uuids: Collection[str] | None = None,
    node_id: str | None = None,
    verifier: OrderVerifier | None = None,
) -> OrderCheck:
    """Judge `order` at wall-clock `now`, in this order:

    1. duplicate when (allocation_id, attempt) is in `known` (checked first: a re-sent order for a workload that
       already started must not be answered "refused", which would release a live allocation; a duplicate starts
       nothing, so it needs no signature);
    2. refuse when `authenticate` finds the order is not the control plane's order for this node (before the
       fields below, which an unsigned order could set to anything);
    3. refuse when `order.epoch < highest_epoch` (an order from a deposed control-plane leader);
    4. refuse when `order.expires_at < now`;
    5. refuse when `gpu_uuids` is given and the order names a GPU (or MIG instance) this node does not have;
    6. else launch.
    """
    if (order.allocation_id, order.attempt) in known:
        return OrderCheck("duplicate", "already launched on this node")
    problem = authenticate(order, node_id=node_id, verifier=verifier)
    if problem is not None:
        return OrderCheck("refuse", problem)
    if order.epoch < highest_epoch:
        return OrderCheck("refuse", f"stale order: epoch {order.epoch} < highest seen {highest_epoch}")
    if not order.expires_at >= now:  # written so that a NaN expiry is refused too
        return OrderCheck("refuse", f"expired order: expires_at {order.expires_at:.3f} < now {now:.3f}")
    if gpu_uuids is not None:
        unknown = sorted({grant.uuid for grant in order.gpus} - set(gpu_uuids))
        if unknown:
            return OrderCheck("refuse", f"unknown GPU(s) on this node: {', '.join(unknown)}")
    return OrderCheck("launch")


_KEY: TypeAdapter[tuple[AllocationId, Attempt]] = TypeAdapter(tuple[AllocationId, Attempt])


def order_key(frame: Mapping[str, Any]) -> WorkloadKey | None:
    """The (allocation, attempt) of a launch frame when a task status may name them (protocol bounds), else None."""
    try:
        allocation, attempt = _KEY.validate_python((frame.get("allocation_id"), frame.get("attempt")), strict=True)
    except ValidationError:
        return None
    return allocation, attempt


def unchecked_launch(frame: Mapping[str, Any]) -> Launch | None:
    """A launch frame that failed validation, as a Launch holding its fields as received, for `authenticate` (the
    signature covers them as sent); None when its fields, or a GPU grant's, are not exactly those of the protocol's
    order, which the control plane never sends (so a relay that adds a field cannot pass one off as signed)."""
    gpus = frame.get("gpus")
    if set(frame) != set(Launch.model_fields) or not isinstance(gpus, list):
        return None
    if not all(isinstance(g, dict) and set(g) == set(GpuGrant.model_fields) for g in gpus):
        return None
    return Launch.model_construct(**{**frame, "gpus": [GpuGrant.model_construct(**g) for g in gpus]})


def launch_problem(frame: Mapping[str, Any]) -> str:
    """What makes `frame` not a valid launch order, field by field ("command[2]: must not contain a NUL character";
    a variable name: "env[name A-B]: ..."), without the values pydantic would quote; names are escaped to printable
    ASCII. "" for a valid order."""
    try:
        Launch.model_validate(frame)
    except ValidationError as exc:
        return "; ".join(f"{_loc(e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
                         for e in exc.errors(include_input=False, include_url=False))
    return ""


def _loc(parts: tuple[int | str, ...]) -> str:
    segments: list[str] = []
    for part in parts:
        if isinstance(part, int):
            segments.append(f"[{part}]")
        elif part == "[key]" and segments:  # the error is about the name before it, not its value
            segments[-1] = f"[name {segments[-1].lstrip('.')}]"
        else:
            segments.append(("." if segments else "") + ascii(part)[1:-1])
    return "".join(segments) or "frame"


class EpochRecord:
    """The highest control-plane epoch this node has accepted an order from, kept in `path` when one is given."""

    def __init__(self, path: Path | None = None) -> None:
        self._path = path
        self._highest = self._load()

    @property
    def highest(self) -> int:
        return self._highest

    def observe(self, epoch: int) -> None:
        """Raise the record to `epoch` (never lowers it); persisted atomically."""
        if epoch <= self._highest:
            return
        self._highest = epoch
        if self._path is not None:
            tmp = self._path.with_name(self._path.name + ".tmp")
            tmp.write_text(f"{epoch}\n")
            os.replace(tmp, self._path)

    def _load(self) -> int:
        if self._path is None or not self._path.exists():
            return 0
        try:
            return max(0, int(self._path.read_text().strip()))
        except (OSError, ValueError) as exc:
            log.warning("ignoring unreadable epoch record %s: %s", self._path, exc)
            return 0
