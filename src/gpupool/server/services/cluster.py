"""Queues, nodes, and "who uses what, where"."""

from __future__ import annotations

from collections import Counter
from datetime import UTC, datetime

from fastapi import HTTPException
from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from gpupool.protocol import api
from gpupool.protocol.devices import GpuTelemetry
from gpupool.server.auth import Principal, require
from gpupool.server.db.models import Allocation, Gpu, Job, Node, Org, Project, QueueRow, User
from gpupool.server.db.repositories import OPEN_ALLOCATION_STATES, QueueIndex
from gpupool.server.scheduler.cache import POD_PREFIX, ClusterCache
from gpupool.server.services import ceilings, quota_tree
from gpupool.server.services.tenancy import org_for


def _resources(raw: api.Resources | None) -> dict[str, object] | None:
    return None if raw is None else raw.model_dump(exclude_none=True)


#: the states of jobs that hold a queue: a queue with one of them cannot become a parent (jobs live in leaves)
HOLDING_STATES = ("pending", "scheduled", "running")


def create_queue(session: Session, principal: Principal, body: api.QueueCreate,
                 above_capacity: str = quota_tree.WARN) -> api.QueueOut:
    """Operators create any queue (of an organisation, or shared with `org` unset); tenant admins create queues of
    their organisation, at the top or under its own queues, within its ceiling (services.ceilings). Names are
    unique within an organisation and among shared queues, and no organisation's queue takes a shared queue's
    name: a 409 names only a queue the caller can see. The quota tree is checked (services.quota_tree; a guarantee
    above the pool's capacity is a warning in the answer, or a 422 when `above_capacity` is "refuse")."""
    require(principal, "tenant-admin")
    org = org_for(session, principal, body.org) if (body.org or not principal.is_operator) else None
    if org is not None and not principal.is_operator:
        ceilings.lock(session, org)
    index = QueueIndex.load(session)
    parent = _parent(session, principal, index, org, body.parent)
    if org is not None and not principal.is_operator:
        ceilings.check(org, index, body, parent)
    _name_free(index, org, body.name)
    threshold = api.gpus_to_milli(body.approval_above_gpus) if body.approval_above_gpus is not None else None
    row = QueueRow(name=body.name, org_id=org.id if org else None, parent=body.parent,
                   guaranteed=_resources(body.guaranteed) or {}, limit=_resources(body.limit),
                   borrow_limit=_resources(body.borrow_limit), lend_limit=_resources(body.lend_limit),
                   over_quota_weight=body.over_quota_weight, priority=body.priority, approval_above_milli=threshold,
                   preempt_min_runtime_s=body.preempt_min_runtime_s,
                   reclaim_min_runtime_s=body.reclaim_min_runtime_s, idle_reclaim_s=body.idle_reclaim_s,
                   max_disconnect_s=body.max_disconnect_s, hold_unsatisfiable=body.hold_unsatisfiable)
    session.add(row)
    try:
        session.flush()
        index = QueueIndex.load(session)
        index.tree()  # the whole tree must stay valid
    except IntegrityError:
        raise HTTPException(409, f"queue {body.name!r} exists") from None
    except ValueError as exc:
        raise HTTPException(422, f"queue: {exc}") from None
    warnings = quota_tree.check(session, index, row, above_capacity)
    return queue_out(session, row).model_copy(update={"warnings": warnings})


def queue_out(session: Session, row: QueueRow) -> api.QueueOut:
    """`row` as the API shows it, without usage figures (after a change)."""
    return _queue_out(session, row, "", {}, {}, {})


def _parent(session: Session, principal: Principal, index: QueueIndex, org: Org | None,
            name: str | None) -> QueueRow | None:
    """The queue `name` names as the new queue's parent: the organisation's own, else a shared one (a shared
    queue's parent is shared). 422 when there is none; 403 when a tenant admin names a shared one; 409 when it
    holds jobs."""
    if name is None:
        return None
    parent = index.find(org.id if org else None, name)
    if parent is None:
        raise HTTPException(422, f"parent: queue {name!r} not found")
    if parent.org_id is None and org is not None and not principal.is_operator:
        raise HTTPException(403, f"parent: {name!r} is a shared queue; only an operator puts a queue under it")
    holding = select(Job.id).where(Job.queue == parent.name, Job.state.in_(HOLDING_STATES))
    if parent.org_id is not None:
        holding = holding.where(Job.org_id == parent.org_id)
    if session.scalar(holding.limit(1)):
        raise HTTPException(409, f"parent: queue {name!r} holds jobs; a parent queue cannot")
    return parent


def _name_free(index: QueueIndex, org: Org | None, name: str) -> None:
    """409 when the new queue's name is taken where the caller looks: in its organisation, or by a shared queue
    (which every tenant sees); a shared queue's name must be free in every organisation (operators see all)."""
    if org is not None:
        taken = index.find(org.id, name)
        if taken is not None:
            shared = " (a shared queue)" if taken.org_id is None else ""
            raise HTTPException(409, f"queue {name!r} exists{shared}")
        return
    owners = sorted(index.orgs.get(r.org_id, "") if r.org_id else "" for r in index.rows if r.name == name)
    if owners:
        where = ", ".join(f"organisation {o!r}" if o else "shared" for o in owners)
        raise HTTPException(409, f"queue {name!r} exists ({where})")


def list_queues(session: Session, principal: Principal, fair_shares: dict[str, int]) -> list[api.QueueOut]:
    """The queues the caller sees (its organisation's and the shared ones; operators: all), with usage, jobs and
    fair share; `fair_shares` is keyed by the scheduling core's queue keys (repositories.queue_key)."""
    index = QueueIndex.load(session)
    used: Counter[str] = Counter()
    counts: Counter[tuple[str, str]] = Counter()
    oldest: dict[str, datetime] = {}
    for org_id, queue, state, submitted in session.execute(select(
            Job.org_id, Job.queue, Job.state, Job.submitted_at).where(Job.state.in_(HOLDING_STATES))):
        key = index.key(org_id, queue)
        counts[(key, "pending" if state == "pending" else "running")] += 1
        if state == "pending" and (key not in oldest or submitted < oldest[key]):
            oldest[key] = submitted
    for milli, org_id, queue in session.execute(select(Allocation.gpu_milli, Job.org_id, Job.queue).join(
            Job, Job.id == Allocation.job_id).where(Allocation.state.in_(OPEN_ALLOCATION_STATES))):
        used[index.key(org_id, queue)] += milli
    visible = [r for r in index.rows if principal.is_operator or r.org_id in (None, principal.org_id)]
    return [_queue_out(session, r, index.row_key(r), used, counts, fair_shares, oldest) for r in visible]


def _queue_out(session: Session, row: QueueRow, key: str, used: Counter[str] | dict[str, int],
               counts: Counter[tuple[str, str]] | dict[tuple[str, str], int],
               fair_shares: dict[str, int], oldest: dict[str, datetime] | None = None) -> api.QueueOut:
    """`row` as the API shows it; `key` is its key in `used`, `counts`, `fair_shares` and `oldest` (the submission
    time of its longest-waiting pending job)."""
    org = session.get(Org, row.org_id) if row.org_id else None
    return api.QueueOut(name=row.name, parent=row.parent, org=org.name if org else None, guaranteed=row.guaranteed,
                        limit=row.limit, over_quota_weight=row.over_quota_weight, priority=row.priority,
                        max_disconnect_s=row.max_disconnect_s, hold_unsatisfiable=row.hold_unsatisfiable,
                        used_gpus=used.get(key, 0) / 1000,
                        fair_share_gpus=fair_shares.get(key, 0) / 1000,
                        pending_jobs=counts.get((key, "pending"), 0),
                        running_jobs=counts.get((key, "running"), 0),
                        oldest_pending_at=(oldest or {}).get(key))


def list_nodes(session: Session, principal: Principal, telemetry: dict[str, list[GpuTelemetry]]) -> list[api.NodeOut]:
    require(principal, "viewer")
    allocated: Counter[str] = Counter()
    tasks: Counter[str] = Counter()
    for alloc in session.scalars(select(Allocation).where(Allocation.state.in_(OPEN_ALLOCATION_STATES))):
        tasks[alloc.node_id] += 1
        for index, milli, _ in alloc.shares:
            allocated[f"{alloc.node_id}/{index}"] += milli
    out = []
    for node in session.scalars(select(Node).where(Node.state != "removed").order_by(Node.name)):
        tele = {t.uuid: t for t in telemetry.get(node.id, [])}
        gpus = [api.GpuOut(index=g.index, uuid=g.uuid, model=g.model, memory_mib=g.memory_mib,
                           allocated_milli=allocated[f"{node.id}/{g.index}"],
                           utilization_pct=tele[g.uuid].utilization_pct if g.uuid in tele else None,
                           temperature_c=tele[g.uuid].temperature_c if g.uuid in tele else None, fake=g.fake)
                for g in session.scalars(select(Gpu).where(Gpu.node_id == node.id, Gpu.retired_at.is_(None))
                                             .order_by(Gpu.index))]
        out.append(api.NodeOut(name=node.name, state=node.state, cordoned=node.cordoned, cpu_milli=node.cpu_milli,
                               memory_mib=node.memory_mib, site=node.site, gpus=gpus, last_seen=node.last_seen,
                               untrusted_images=node.untrusted_images, jobs_as=node.jobs_as,
                               drain_since=node.drain_since, drain_deadline=node.drain_deadline,
                               removing=node.remove_when_drained, tasks=tasks[node.id]))
    return out


def backend_nodes(cache: ClusterCache) -> list[api.NodeOut]:
    """The nodes a cluster backend (Kubernetes: server/kube) put in the scheduler's cache, as `list_nodes` shows
    agents' nodes: its source and jobs_as say "kubernetes", its GPUs' allocation and its tasks are what the cache
    holds on them (gpupool's pods bound there)."""
    out = []
    with cache.lock:
        tasks = Counter(h.task.node for h in cache.held.values())
        for entry in sorted(cache.nodes.values(), key=lambda e: e.spec.name):
            if not entry.node_id.startswith(POD_PREFIX):
                continue
            i = cache.table.index[entry.spec.name]
            free = cache.table.states[i].gpu_free
            gpus = [api.GpuOut(index=g.index, uuid=g.uuid, model=g.model, memory_mib=g.memory_mib,
                               allocated_milli=1000 - free[g.index]) for g in entry.spec.gpus]
            out.append(api.NodeOut(name=entry.spec.name, state="ready" if entry.schedulable else "unschedulable",
                                   cordoned=not entry.schedulable, cpu_milli=entry.spec.cpu_milli,
                                   memory_mib=entry.spec.memory_mib, site=entry.spec.site, gpus=gpus, last_seen=None,
                                   jobs_as="kubernetes", tasks=tasks[entry.spec.name], source="kubernetes"))
    return out


def set_cordon(session: Session, principal: Principal, name: str, cordoned: bool) -> Node:
    require(principal, "operator")
    node = session.scalar(select(Node).where(Node.name == name, Node.state != "removed"))
    if node is None:
        raise HTTPException(404, f"node {name!r} not found")
    node.cordoned = cordoned
    if not cordoned:  # a drained node takes work again too (services.draining)
        node.drain_since, node.drain_deadline, node.remove_when_drained = None, None, False
    return node


def operator_node_id(session: Session, principal: Principal, name: str) -> str:
    """The id of the node `name` an operator resets or marks down (AgentHub does it); 404 for an unknown name."""
    require(principal, "operator")
    node_id = session.scalar(select(Node.id).where(Node.name == name, Node.state != "removed"))
    if node_id is None:
        raise HTTPException(404, f"node {name!r} not found")
    return node_id


def top(session: Session, principal: Principal) -> list[api.UsageRow]:
    """Every open allocation the caller may see: project, user, node, job, GPUs held and since when."""
    rows = []
    query = select(Allocation, Job).join(Job, Job.id == Allocation.job_id).where(
        Allocation.state.in_(OPEN_ALLOCATION_STATES))
    if not principal.is_operator:
        query = query.where(Job.org_id == principal.org_id)
    nodes = {n.id: n.name for n in session.scalars(select(Node))}
    models = {(g.node_id, g.index): g.model for g in session.scalars(select(Gpu))}
    projects = {p.id: p.name for p in session.scalars(select(Project))}
    users = {u.id: u.name for u in session.scalars(select(User))}
    for alloc, job in session.execute(query):
        if not principal.at_least("tenant-admin") and projects.get(job.project_id) not in principal.projects:
            continue
        gpu_models = ({alloc.gpu_model} if alloc.node_id is None and alloc.gpu_model is not None
                      else {models.get((alloc.node_id, i), "") for i, _, _ in alloc.shares})
        rows.append(api.UsageRow(project=projects.get(job.project_id, ""), user=users.get(job.user_id, ""),
                                 node=node_name(alloc, nodes), job=job.id, gpus=alloc.gpu_milli / 1000,
                                 gpu_models=sorted(gpu_models), since=alloc.started_at or alloc.created_at))
    return sorted(rows, key=lambda r: (r.project, r.user, r.node, r.job))


def node_name(allocation: Allocation, nodes: dict[str, str]) -> str:
    """Where an allocation is: its node's name (`nodes`: id -> name), or a pod's Kubernetes node."""
    if allocation.node_id is None:
        return allocation.node_name or ""
    return nodes.get(allocation.node_id, "")


def now_utc() -> datetime:
    return datetime.now(UTC)
