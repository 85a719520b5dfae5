"""A gang's rendezvous: what each of its tasks is told to meet the others (gpupool.protocol.agent.Rendezvous).

A gang is a job placed as several tasks in one attempt. Ranks are task indexes; a node's tasks are numbered in task
order for LOCAL_RANK; the hostfile has one line per node, in the order of each node's first task, so task 0's node
comes first; MASTER_ADDR is the address of task 0's node. Task 0 is launched first, with MASTER_PORT left to its
agent; the port it reports is recorded on task 0's allocation (`record_port`), and the other tasks are launched then.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.protocol.agent import GangHost, Rendezvous
from gpupool.server.db.models import Allocation, Job

#: (task index, node id) of each task of one attempt of a gang
Members = Sequence[tuple[int, str]]


def rendezvous(members: Members, addresses: Mapping[str, str], task_index: int, port: int) -> Rendezvous | None:
    """The rendezvous of task `task_index` among `members` (None for a job of one task); `addresses` maps node ids to
    where other nodes reach them (a node missing from it is named by its id); `port` is MASTER_PORT, 0 when task 0's
    agent is to choose it."""
    if len(members) < 2:
        return None
    ordered = sorted(members)
    per_node: dict[str, list[int]] = {}
    for index, node_id in ordered:
        per_node.setdefault(node_id, []).append(index)
    node_of = dict(ordered)
    mine = per_node[node_of[task_index]]
    hosts = [GangHost(address=addresses.get(node_id, node_id), slots=len(tasks)) for node_id, tasks in per_node.items()]
    return Rendezvous(world_size=len(ordered), rank=task_index, local_rank=mine.index(task_index),
                      local_world_size=len(mine), master_addr=hosts[0].address, master_port=port, hosts=hosts)


def members(session: Session, allocation: Allocation) -> tuple[list[tuple[int, str]], int | None]:
    """The (task index, node id) of every task of `allocation`'s attempt, and the MASTER_PORT task 0 reported."""
    rows = session.execute(select(Allocation.task_index, Allocation.node_id, Allocation.rendezvous_port).where(
        Allocation.job_id == allocation.job_id, Allocation.attempt == allocation.attempt)).all()
    port = next((r.rendezvous_port for r in rows if r.task_index == 0), None)
    return [(r.task_index, r.node_id) for r in rows], port


def record_port(session: Session, allocation_id: str, attempt: int, port: int | None) -> list[Allocation]:
    """Record the MASTER_PORT task 0's agent reported for `allocation_id` at `attempt`; the allocations of the gang's
    other tasks still to launch (none when the report is not task 0's, is a repeat, or its job has moved on)."""
    allocation = session.get(Allocation, allocation_id)
    if port is None or allocation is None or allocation.task_index != 0 or allocation.attempt != attempt:
        return []
    if allocation.rendezvous_port is not None:
        return []
    job = session.get(Job, allocation.job_id)
    if job is None or job.attempt != attempt or job.state not in ("scheduled", "running"):
        return []
    allocation.rendezvous_port = port
    return list(session.scalars(select(Allocation).where(
        Allocation.job_id == allocation.job_id, Allocation.attempt == attempt, Allocation.task_index > 0,
        Allocation.state == "starting").order_by(Allocation.task_index)))
