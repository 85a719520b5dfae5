"""The server end of every agent's outbound channel, in rooms: `base` (the hub's state, leadership and the one door
orders leave by), `identity` (registration, admission, renewal, reset), `reports` (applying reports in),
`channel` (serving a connection: frames in, acks and orders out) and `liveness` (silence, loss, the monitor).
`AgentHub` is the one object the rest of the control plane holds.
"""

from __future__ import annotations

from gpupool.server.agents.base import AgentSocket, Refused
from gpupool.server.agents.channel import Channel
from gpupool.server.agents.liveness import Liveness

__all__ = ["AgentHub", "AgentSocket", "Refused"]


class AgentHub(Channel, Liveness):
    """Registration, orders out, reports in, liveness: one hub per control plane process, driven from its event
    loop (the channels, the monitor) and from request threads (registration, reset, `send`)."""
