"""Frames in: what the agent does with each frame from the control plane (`Launch`, `Stop`, `Ack`, `Rejected`,
`Certificate`: see gpupool.agent.channel), and self-fencing when no control plane has been heard for a workload's
max_disconnect (RELIABILITY.md §4.2).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

from gpupool.agent.outbox import Outbox
from gpupool.agent.runtime.base import RunHandle, WorkloadRuntime
from gpupool.agent.timing import (
    Backoff,
    Silence,
)
from gpupool.agent.tls import Renewal
from gpupool.agent.workloads import Workloads
from gpupool.protocol.agent import (
    Ack,
    Certificate,
    Launch,
    Rejected,
    ServerFrame,
    Stop,
)

if TYPE_CHECKING:
    from gpupool.agent.channel import ChannelConfig

log = logging.getLogger("gpupool.agent.channel")
SERVER_FRAMES: TypeAdapter[Launch | Stop | Ack | Rejected | Certificate] = TypeAdapter(ServerFrame)


class FrameHandler:
    """Applies the control plane's frames to the node's workloads; `Channel` connects it and owns the state it
    reads (set in `Channel.__init__`)."""

    _config: ChannelConfig
    _runtime: WorkloadRuntime
    _stops: set[asyncio.Task[None]]
    renewal: Renewal | None
    outbox: Outbox
    workloads: Workloads
    silence: Silence
    backoff: Backoff

    def handle_frame(self, raw: str | bytes) -> None:
        """Apply one frame from the control plane (any valid frame also counts as word from it for fencing)."""
        try:
            frame = SERVER_FRAMES.validate_json(raw)
        except ValidationError:
            # never the frame itself nor pydantic's message (it quotes input): a launch order carries secret env values
            launch = _launch_fields(raw)
            if launch is not None:  # answered, never dropped: the control plane would hold its GPUs
                self.workloads.on_invalid_launch(launch)
                return
            log.warning("ignoring a malformed frame from the control plane: type %s, %d bytes", _frame_type(raw),
                        len(raw))
            return
        self.silence.heard()
        self._renew_lease()
        self.backoff.reset()
        if isinstance(frame, Ack):
            self.workloads.on_acked(self.outbox.ack(frame.seq))
        elif isinstance(frame, Rejected):
            log.warning("the control plane rejected frame %d (%d): %s", frame.seq, frame.code, frame.reason)
            self.workloads.on_acked(self.outbox.ack(frame.seq))
        elif isinstance(frame, Launch):
            self.workloads.on_launch(frame)
        elif isinstance(frame, Certificate):
            if self.renewal is None or not self.renewal.accept(frame.certificate):
                log.warning("ignoring a certificate from the control plane that was not asked for or does not fit")
            else:
                log.info("channel certificate renewed (valid until %s)", self.renewal.tls.validity[1])
        else:
            handle = self.workloads.on_stop(frame)
            if handle is not None:
                self._stop_in_background(handle, frame.grace_s)

    def check_fence(self) -> bool:
        """Fence every workload whose max_disconnect (the node's `fence_s` for one without its own) the control
        plane's silence has reached: stop it. True if it fenced any."""
        silence = self.silence.silence_s()
        handles = self.workloads.fence(silence, self._config.fence_s)
        if not handles:
            return False
        log.error("self-fencing: no word from any control plane for %.1f s; stopping %d workload(s) past their "
                  "max_disconnect", silence, len(handles))
        for handle in handles:
            self._stop_in_background(handle, self._config.kill_grace_s)
        return True

    def _renew_lease(self) -> None:
        """Tell the runtime's watchdogs we just heard from the control plane (the real monotonic clock, which they
        read in other processes); a failed write only means they may fence early, so it never stops the channel."""
        try:
            self._runtime.renew_lease(time.monotonic())
        except OSError as exc:
            log.warning("could not renew the workloads' lease: %s", exc)

    def _stop_in_background(self, handle: RunHandle, grace_s: float) -> None:
        task = asyncio.create_task(self._stop(handle, grace_s))
        self._stops.add(task)
        task.add_done_callback(self._stops.discard)

    async def _stop(self, handle: RunHandle, grace_s: float) -> None:
        try:
            await asyncio.to_thread(self._runtime.stop, handle, grace_s)
        except Exception:  # reported by the next poll; keep the agent alive
            log.exception("stopping %s failed", handle.key)


def _frame_type(raw: str | bytes) -> str:
    """The `type` of a frame for a log line: a short word, or "?" (not JSON, no such field, or an odd value)."""
    try:
        kind = json.loads(raw).get("type")
    except (ValueError, AttributeError, RecursionError):
        return "?"
    return kind if isinstance(kind, str) and kind.isidentifier() and len(kind) <= 32 else "?"



def _launch_fields(raw: str | bytes) -> dict[str, Any] | None:
    """The JSON object of a frame whose `type` is "launch" (however broken its fields), or None."""
    try:
        frame = json.loads(raw)
    except (ValueError, RecursionError):
        return None
    return frame if isinstance(frame, dict) and frame.get("type") == "launch" else None
