"""The server end of one admitted channel: frames in (each applied at most once per (boot_id, seq) and acked),
orders out (the node's queue, pumped onto its one live connection).

A node's reports are applied at most once per (boot_id, seq), only a Hello starts a new boot and a boot once
replaced never comes back (a replayed frame changes nothing, not even the node's liveness). A node holds one
channel at a time: a newly admitted channel closes the node's older ones (REPLACED, 4409).
"""

from __future__ import annotations

import asyncio
import time

from pydantic import ValidationError
from websockets.exceptions import ConnectionClosed

from gpupool.protocol.agent import (
    MAX_FRAME_BYTES,
    Ack,
    Heartbeat,
    Hello,
    LogChunk,
    Renew,
    TaskStatus,
)
from gpupool.server.agents.base import FRAMES, REPLACED, RETIRED_BOOTS, AgentSocket, ServerFrameOut, log
from gpupool.server.agents.reports import Reports


class Channel(Reports):
    """Serving admitted channels (see the module docstring)."""

    async def serve(self, node_id: str, serial: str, ws: AgentSocket) -> None:
        """Serve one admitted channel of `node_id` until it closes (see the module docstring)."""
        queue = self.queues.setdefault(node_id, asyncio.Queue())
        self.held.pop(node_id, None)
        self.resync.discard(node_id)
        live = self.sessions.setdefault(node_id, {})
        self._replace(node_id, serial, live)
        sender = live[ws] = asyncio.create_task(self._pump(node_id, ws, queue))
        try:
            while True:
                raw = await ws.recv()
                if not isinstance(raw, str):  # a binary frame: not part of the protocol
                    await ws.close(code=1003)
                    return
                if len(raw) > MAX_FRAME_BYTES:
                    await ws.close(code=1009)
                    return
                if not self.leads():  # deposed: acknowledge nothing, so the agent hears silence and moves on
                    await ws.close(code=1013, reason="not the leader")
                    return
                await self._handle(node_id, raw)
                if node_id in self.resync:  # the database is back: re-sent reports come on the next connection
                    await ws.close(code=1013)
                    return
        except ConnectionClosed:
            pass
        finally:
            sender.cancel()
            live.pop(ws, None)

    def _replace(self, node_id: str, serial: str, live: dict[AgentSocket, asyncio.Task[None]]) -> None:
        """Close the node's older channels (one with certificate `serial` was admitted): their pumps stop at once, so
        no order leaves by a connection that may be dead (an agent reconnects after a network cut before the old
        one times out), and one node never holds more than one channel's worth of the listener."""
        for old, pump in list(live.items()):
            pump.cancel()
            del live[old]
            log.info("node %s: a channel with certificate %s replaces an open one (closed %d)", node_id, serial,
                     REPLACED)
            task = asyncio.create_task(old.close(REPLACED, "replaced by a newer channel of this node"))
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def _pump(self, node_id: str, ws: AgentSocket, queue: asyncio.Queue[ServerFrameOut]) -> None:
        while True:
            frame = await queue.get()
            try:
                await ws.send(frame.model_dump_json())
            except Exception:  # the socket closed: keep the frame for the next connection
                queue.put_nowait(frame)
                return
            self.last_sent[node_id] = time.monotonic()  # it may have reached the agent: its silence counts from here

    async def _handle(self, node_id: str, raw: str) -> None:
        if node_id in self.reset_nodes:
            return  # a channel the reset is closing: nothing it says counts any more
        try:
            frame = FRAMES.validate_json(raw)
        except (ValidationError, ValueError, RecursionError) as exc:
            log.warning("node %s sent a malformed frame: %s", node_id, str(exc)[:200])
            return
        boot, seq = self.seqs.get(node_id, ("", -1))
        if frame.boot_id != boot and not self._new_boot(node_id, boot, frame):
            return  # not acked: a live agent sends Hello first on every connection and then re-sends
        if frame.boot_id != boot or frame.seq > seq:
            self.last_seen[node_id] = time.monotonic()
            self.seqs[node_id] = (frame.boot_id, frame.seq)
            rejected = await asyncio.to_thread(self._apply_held, node_id, frame)
            if rejected is not None:
                self.send(node_id, rejected)
                return
        self.send(node_id, Ack(seq=min(frame.seq, self.held.get(node_id, frame.seq))))

    def _new_boot(self, node_id: str, boot: str, frame: Hello | Heartbeat | TaskStatus | LogChunk | Renew) -> bool:
        """May `frame` start a new boot of the node's agent? Only a Hello of a boot never replaced may; the boot it
        replaces is retired (a replayed frame of a former boot is then dropped, whatever its seq)."""
        retired = self.retired_boots.setdefault(node_id, [])
        if not isinstance(frame, Hello) or frame.boot_id in retired:
            log.warning("node %s: dropping a %s frame of boot %s (current boot %s)", node_id, frame.type,
                        frame.boot_id, boot or "none yet")
            return False
        if boot:
            retired.append(boot)
            del retired[:-RETIRED_BOOTS]
        return True
