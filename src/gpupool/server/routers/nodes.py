"""HTTP routes that drain, undrain and remove nodes (operators; services.draining). Audited like every write."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request

from gpupool.protocol import api
from gpupool.server.auth import Principal, principal_from
from gpupool.server.services import draining

router = APIRouter(prefix="/api/v1")
Caller = Annotated[Principal, Depends(principal_from)]


@router.post("/nodes/{name}/drain", response_model=api.NodeActionOut, tags=["nodes"])
def drain(name: str, who: Caller, request: Request, body: api.DrainRequest | None = None) -> api.NodeActionOut:
    """Operators: the node takes no new work; what runs there ends on its own or, past `deadline_s`, is stopped
    with the pool's kill grace and requeued. Draining again replaces the deadline. `dry_run`: change nothing."""
    body = body or api.DrainRequest()
    state = request.app.state
    with state.db.session() as session:
        out = draining.drain(session, who, name, body, datetime.now(UTC))
    if not body.dry_run:
        state.cache.set_schedulable(name, False)
    return out


@router.post("/nodes/{name}/undrain", response_model=api.NodeActionOut, tags=["nodes"])
def undrain(name: str, who: Caller, request: Request) -> api.NodeActionOut:
    """Operators: the node takes work again (a drain, its deadline and a pending removal are called off)."""
    state = request.app.state
    with state.db.session() as session:
        node, out = draining.undrain(session, who, name)
        ready = node.state == "ready"
    state.cache.set_schedulable(name, ready)
    state.scheduler.wake()
    return out


@router.delete("/nodes/{name}", response_model=api.NodeActionOut, tags=["nodes"])
def remove(name: str, who: Caller, request: Request, force: Annotated[bool, Query()] = False,
           dry_run: Annotated[bool, Query()] = False) -> api.NodeActionOut:
    """Operators: remove a node that runs nothing (409 naming its jobs otherwise); with `force`, its work is
    requeued now (stopped with the pool's kill grace) and the node removed once that work has stopped. A removed
    node's identity is revoked and its GPUs retired; its usage history stays and its name is free for a join token.
    `dry_run`: say what would happen, change nothing."""
    state = request.app.state
    with state.db.session() as session:
        node_id, out = draining.removal(session, who, name, force, dry_run, datetime.now(UTC))
    if dry_run:
        return out
    state.cache.set_schedulable(name, False)
    if out.work:
        state.lifecycle.evict_node(node_id, f"node {name} is being removed")
    else:
        state.hub.reset_node(node_id, draining.REMOVED)
        state.principals.clear()  # this process forgets the node's credential at once; others within PRINCIPAL_TTL_S
    state.scheduler.wake()
    return out
