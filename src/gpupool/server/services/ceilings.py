"""Organisation ceilings: only operators grant capacity (issue 41, finding 5).

A tenant admin arranges its organisation's queues, but what they take from other organisations is the operator's
to grant: guarantees, limits, over-quota weights and priorities within the organisation's ceiling (api.OrgCeiling,
set with PUT /orgs/{name}/ceiling). Queues share capacity only with their siblings, so what other organisations
feel is the organisation's top-level queues (those whose parent is not one of its own): their guarantees and
weights add up under the ceiling; each queue's own values stay under it too. Operators are not held to it.
"""

from __future__ import annotations

from collections.abc import Iterable
from decimal import Decimal
from typing import Any

from fastapi import HTTPException
from sqlalchemy import update
from sqlalchemy.orm import Session

from gpupool.core import ResourceVector
from gpupool.core.queues import GPU_UNITS
from gpupool.core.units import CPU, MEMORY
from gpupool.protocol import api
from gpupool.server.auth import Principal, require
from gpupool.server.db.models import Org, QueueRow
from gpupool.server.db.repositories import QueueIndex, resources
from gpupool.server.services.tenancy import org_for

MODEL_PREFIX = "gpu:"


def ceiling_of(org: Org) -> api.OrgCeiling:
    """The organisation's ceiling; the defaults of api.OrgCeiling until an operator sets one."""
    return api.OrgCeiling.model_validate(org.ceiling) if org.ceiling else api.OrgCeiling()


def lock(session: Session, org: Org) -> None:
    """Hold the organisation's row for the rest of the transaction (PostgreSQL: a row lock; SQLite: the database
    write lock), so that two queue creations cannot both fit the ceiling's sums with what the other adds."""
    session.execute(update(Org).where(Org.id == org.id).values(ceiling=Org.ceiling))


def check(org: Org, index: QueueIndex, body: api.QueueCreate, parent: QueueRow | None) -> None:
    """403 naming the field when a tenant admin's new queue `body` of `org` (under `parent`) grants beyond the
    ceiling; `index` holds the queues as they are before it."""
    ceiling = ceiling_of(org)
    if body.priority > ceiling.max_priority:
        _refuse("priority", org, f"{body.priority} is above", str(ceiling.max_priority), "max_priority")
    if body.over_quota_weight > ceiling.over_quota_weight:
        _refuse("over_quota_weight", org, f"{body.over_quota_weight} is above", str(ceiling.over_quota_weight))
    cap = _vector(ceiling.guaranteed)
    _each_within("guaranteed", org, _vector(body.guaranteed), cap)
    if ceiling.limit is not None:
        _limit_within(org, _vector(body.limit), _vector(ceiling.limit))
    if parent is None or parent.org_id != org.id:
        tops = top_level(index, org)
        _each_within("guaranteed", org, _vector(body.guaranteed), cap, _total(_vector(q.guaranteed) for q in tops))
        weights = sum(q.over_quota_weight for q in tops)
        if body.over_quota_weight and weights + body.over_quota_weight > ceiling.over_quota_weight:
            _refuse("over_quota_weight", org, f"{body.over_quota_weight} would make its top-level queues' weights "
                    f"add up to {weights + body.over_quota_weight}, above", str(ceiling.over_quota_weight))


def top_level(index: QueueIndex, org: Org) -> list[QueueRow]:
    """The organisation's queues whose parent is not one of its own."""
    return [q for q in index.rows if q.org_id == org.id and not _under_own(index, q)]


def _under_own(index: QueueIndex, queue: QueueRow) -> bool:
    parent = index.parent(queue)
    return parent is not None and parent.org_id == queue.org_id


def get(session: Session, principal: Principal, name: str) -> api.OrgCeilingOut:
    """The ceiling of organisation `name`, as its members or an operator see it."""
    require(principal, "viewer")
    org = org_for(session, principal, name)
    return _out(org, QueueIndex.load(session))


def put(session: Session, principal: Principal, name: str, body: api.OrgCeiling) -> api.OrgCeilingOut:
    """Operators set an organisation's ceiling (all of it); queues granted beyond a lower one stay as they are."""
    require(principal, "operator")
    org = org_for(session, principal, name)
    org.ceiling = body.model_dump(exclude_none=True)
    return _out(org, QueueIndex.load(session))


def _out(org: Org, index: QueueIndex) -> api.OrgCeilingOut:
    ceiling, tops = ceiling_of(org), top_level(index, org)
    return api.OrgCeilingOut(
        org=org.name, guaranteed=ceiling.guaranteed.model_dump(exclude_none=True),
        limit=ceiling.limit.model_dump(exclude_none=True) if ceiling.limit else None,
        over_quota_weight=ceiling.over_quota_weight, max_priority=ceiling.max_priority,
        granted_guaranteed=_resources(_total(_vector(q.guaranteed) for q in tops)),
        granted_over_quota_weight=sum(q.over_quota_weight for q in tops))


def _vector(raw: api.Resources | dict[str, Any] | None) -> ResourceVector:
    if isinstance(raw, api.Resources):
        raw = raw.model_dump(exclude_none=True)
    return resources(raw) or ResourceVector()


def _total(vectors: Iterable[ResourceVector]) -> ResourceVector:
    total = ResourceVector()
    for vector in vectors:
        total = total + vector
    return total


def _each_within(field: str, org: Org, asked: ResourceVector, cap: ResourceVector,
                 already: ResourceVector | None = None) -> None:
    """Refuse a resource that `asked` adds beyond `cap`, alone or (given `already`) with the top-level queues."""
    for resource, amount in asked.items():
        total = amount + (already[resource] if already is not None else 0)
        if amount and total > cap[resource]:
            what = f"{_amount(resource, amount)} is above" if already is None else (
                f"{_amount(resource, amount)} would make its top-level queues guarantee "
                f"{_amount(resource, total)} together, above")
            _refuse(f"{field}.{_field(resource)}", org, what, _amount(resource, cap[resource]))


def _limit_within(org: Org, asked: ResourceVector, cap: ResourceVector) -> None:
    for resource in cap:
        if resource not in asked or asked[resource] > cap[resource]:
            shown = f"{_amount(resource, asked[resource])} is above" if resource in asked else "no limit is above"
            _refuse(f"limit.{_field(resource)}", org, shown, _amount(resource, cap[resource]))


def _refuse(field: str, org: Org, what: str, cap: str, name: str = "") -> None:
    raise HTTPException(403, f"{field}: {what} organisation {org.name!r}'s ceiling of {cap}"
                             f"{f' ({name})' if name else ''}; only an operator grants more "
                             f"(PUT /api/v1/orgs/{org.name}/ceiling, `gpupool org ceiling`)")


def _field(resource: str) -> str:
    """The Resources field a quota resource comes from."""
    if resource.startswith(MODEL_PREFIX):
        return f"per_model.{resource[len(MODEL_PREFIX):]}"
    return {GPU_UNITS: "gpus", CPU: "cpus", MEMORY: "memory_mib"}.get(resource, resource)


def _amount(resource: str, amount: int) -> str:
    return str(amount) if resource == MEMORY else str(Decimal(amount) / 1000)


def _resources(vector: ResourceVector) -> dict[str, Any]:
    """A quota vector as api.Resources fields."""
    out: dict[str, Any] = {}
    for resource, amount in vector.items():
        field = _field(resource)
        if field.startswith("per_model."):
            out.setdefault("per_model", {})[field.split(".", 1)[1]] = _amount(resource, amount)
        elif amount:
            out[field] = amount if resource == MEMORY else _amount(resource, amount)
    return out
