"""Draining and removing nodes (operators): `drain` takes a node out of scheduling while its work goes on; at the
drain's deadline, if any, what still runs there is evicted (stopped with the pool's kill grace) and requeued;
`undrain` makes it take work again. `remove` retires a node that runs nothing (or, forced, evicts its work first
and retires it once that work has stopped): its identity is revoked and its GPUs retired as `node reset` does, and
it leaves the node list; its usage rows and allocations keep naming it, and a join token may take its name again.

A node's drain lives in its row (`drain_since`, `drain_deadline`, `remove_when_drained`, with `cordoned` set), so it
survives a control-plane restart: `Draining.enforce`, on each liveness pass of the scheduler lease's holder, evicts
the work of nodes past their deadline and retires the nodes being removed once empty (or once their stopped work had
`wait_s` to report, for an agent that may never answer).

Node states as operators see them: ready (or unreachable, lost) -> draining (cordoned; deadline or none) -> drained
(draining and empty) -> undrain: ready again | remove: gone from the list (row kept, state "removed").
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from datetime import datetime, timedelta

from fastapi import HTTPException
from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.server.auth import Principal, require
from gpupool.server.db.models import Allocation, Job, Node, Project, User
from gpupool.server.db.repositories import OPEN_ALLOCATION_STATES
from gpupool.server.services.lifecycle import Lifecycle
from gpupool.server.services.metering import aware

#: the state of a removed node's row (its history stays; it is listed no more)
REMOVED = "removed"


def operator_node(session: Session, principal: Principal, name: str) -> Node:
    """The node `name`, for an operator (403 for anyone else); 404 for an unknown or removed one."""
    require(principal, "operator")
    node = session.scalar(select(Node).where(Node.name == name, Node.state != REMOVED))
    if node is None:
        raise HTTPException(404, f"node {name!r} not found")
    return node


def work_on(session: Session, node_id: str) -> list[api.NodeWork]:
    """Every open allocation on the node, by job and task: what a drain or a removal would touch."""
    rows = session.execute(select(Allocation.job_id, Allocation.task_index, Allocation.state, Project.name,
                                  User.name).join(Job, Job.id == Allocation.job_id)
                           .outerjoin(Project, Project.id == Job.project_id).outerjoin(User, User.id == Job.user_id)
                           .where(Allocation.node_id == node_id, Allocation.state.in_(OPEN_ALLOCATION_STATES)))
    return sorted((api.NodeWork(job=job, task_index=task, state=state, project=project or "", user=user or "")
                   for job, task, state, project, user in rows), key=lambda w: (w.job, w.task_index))


def drain(session: Session, principal: Principal, name: str, body: api.DrainRequest,
          now: datetime) -> api.NodeActionOut:
    """Drain the node `name` (again: the new deadline replaces the old one); with `dry_run`, only say what runs
    there. The caller takes the node out of the scheduler's cache once this commits."""
    node = operator_node(session, principal, name)
    deadline = None if body.deadline_s is None else now + timedelta(seconds=body.deadline_s)
    work = work_on(session, node.id)
    if not body.dry_run:
        node.cordoned, node.drain_since, node.drain_deadline = True, node.drain_since or now, deadline
    when = f"evicted and requeued at {deadline.isoformat(timespec='seconds')}" if deadline else "left to end"
    verb = "would take" if body.dry_run else "takes"
    return api.NodeActionOut(node=name, action="drain", dry_run=body.dry_run, deadline=deadline, work=work,
                             message=f"node {name} {verb} no new work; {len(work)} task(s) running there "
                                     f"{'would be ' if body.dry_run else 'are '}{when}")


def undrain(session: Session, principal: Principal, name: str) -> tuple[Node, api.NodeActionOut]:
    """Make the node take work again (also a drain's pending removal is called off)."""
    node = operator_node(session, principal, name)
    clear(node)
    return node, api.NodeActionOut(node=name, action="undrain", dry_run=False, work=work_on(session, node.id),
                                   message=f"node {name} takes work again")


def clear(node: Node) -> None:
    """Neither cordoned nor draining any more (undrain, uncordon)."""
    node.cordoned, node.drain_since, node.drain_deadline, node.remove_when_drained = False, None, None, False


def removal(session: Session, principal: Principal, name: str, force: bool, dry_run: bool,
            now: datetime) -> tuple[str, api.NodeActionOut]:
    """Decide the removal of `name`: (node id, answer). 409 naming the jobs when work is open there and not
    `force`. Forced over work (and not a dry run), the node is marked for removal with its deadline now: the caller
    evicts the work, and `Draining.enforce` retires the node once it has stopped. An empty node is the caller's to
    retire at once."""
    node = operator_node(session, principal, name)
    work = work_on(session, node.id)
    if work and not force:
        jobs = ", ".join(sorted({w.job for w in work}))
        raise HTTPException(409, f"node {name!r} runs {len(work)} task(s) of job(s) {jobs}: drain it first, or "
                                 "remove it with force (its work is requeued)")
    if work and not dry_run:
        node.cordoned, node.drain_since = True, node.drain_since or now
        node.drain_deadline, node.remove_when_drained = now, True
    if dry_run:
        message = f"node {name} would be removed" + (f"; {len(work)} task(s) requeued" if work else "")
    elif work:
        message = f"node {name}: {len(work)} task(s) requeued; it is removed once they have stopped"
    else:
        message = f"node {name} removed: its identity is revoked and its GPUs retired; its history stays"
    return node.id, api.NodeActionOut(node=name, action="remove", dry_run=dry_run, deadline=now if work else None,
                                      work=work, message=message)


class Draining:
    """Enforces drains (see the module docstring); `retire(node_id)` removes a node (AgentHub.reset_node with
    the state "removed"); `resetting()` names the nodes a reset is taking out right now (AgentHub.reset_nodes)."""

    def __init__(self, lifecycle: Lifecycle, retire: Callable[[str], object], wait_s: float,
                 resetting: Callable[[], Collection[str]] = frozenset) -> None:
        self.lifecycle, self.retire, self.wait_s, self.resetting = lifecycle, retire, wait_s, resetting

    def enforce(self, now: datetime, epoch: int | None = None) -> None:
        """One pass: the scheduler's cache follows the nodes' rows (`follow`); evict the running work of draining
        nodes past their deadline; retire the nodes being removed that run nothing any more, or whose work was told
        to stop more than `wait_s` ago."""
        self.follow()
        with self.lifecycle.db.session() as session:
            draining = session.execute(select(Node.id, Node.name, Node.drain_deadline, Node.remove_when_drained)
                                       .where(Node.drain_since.is_not(None), Node.state != REMOVED)).all()
            open_rows = session.execute(select(Allocation.node_id, Allocation.state).where(
                Allocation.node_id.in_([row.id for row in draining]),
                Allocation.state.in_(OPEN_ALLOCATION_STATES))).all()
        busy = {node_id for node_id, _ in open_rows}
        live = {node_id for node_id, state in open_rows if state != "stopping"}
        for node_id, name, deadline, remove in draining:
            if deadline is None or aware(deadline) > now:
                continue
            if node_id in live:
                self.lifecycle.evict_node(node_id, f"node {name} was drained and its deadline passed", epoch)
            overdue = now - aware(deadline) > timedelta(seconds=self.wait_s)
            if remove and (node_id not in busy or overdue):
                self.retire(node_id)

    def follow(self) -> None:
        """Make the scheduler's cache take each node as its row says (ready and not cordoned: schedulable): a drain,
        undrain or cordon that a standby control plane answered reaches the leader's scheduler within a pass. Nodes
        a reset is taking out are left alone (the reset marks them unschedulable before its row changes). A pass
        that raced a change of this process (a cordon committed after its read) applies nothing: the next one
        reads it."""
        cache = self.lifecycle.cache
        read_after = cache.schedulable_changes
        with self.lifecycle.db.session() as session:
            rows = session.execute(select(Node.id, Node.name, Node.state, Node.cordoned)).all()
        skip = set(self.resetting())
        cache.follow_rows({name: state == "ready" and not cordoned for node_id, name, state, cordoned in rows
                           if node_id not in skip}, read_after)
