"""One pool, one set of keys: every control plane that may lead the pool holds the same three keys.

* the master key (`master.key`), which wraps every organisation's data key: a leader with another one cannot open
  the job secrets it must send with launch orders, and would wrap new data keys that the others cannot open;
* the agent CA (`ca.key`, `ca.crt`): agents trust only the CA they joined, and present certificates it issued;
* the order-signing key (`order-signing.key`): agents pinned it at join and refuse orders signed by another.

The first control plane to start on a database records the keys' fingerprints there (table `pool_keys`; none is
secret). Every other control plane, and every start after, compares its own files with them: one that differs
refuses to lead (it never takes the scheduler lease, so it sends no order and admits no agent) and says why, in one
line naming the file, in its log and in /readyz. `gpupool rotate-master-key` records the new master key.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from gpupool.server.db.models import PoolKey, utcnow

MASTER_KEY, AGENT_CA, ORDER_KEY = "master_key", "agent_ca", "order_key"


@dataclass(frozen=True)
class HeldKeys:
    """This control plane's keys: the master key ids it holds (the primary first), the agent CA's hash and the order
    key's hash, each with the file it comes from (for the message)."""

    master_ids: tuple[str, ...]
    master_file: str
    ca_hash: str
    ca_file: str
    order_hash: str
    order_file: str

    def fingerprints(self) -> dict[str, str]:
        """What a first start records: the primary master key id and the two hashes."""
        return {MASTER_KEY: self.master_ids[0], AGENT_CA: self.ca_hash, ORDER_KEY: self.order_hash}


def check_or_record(session: Session, held: HeldKeys) -> str | None:
    """Record `held`'s fingerprints where the pool has none yet; then why this control plane may not lead (one line)
    or None when it holds the pool's keys."""
    recorded = {row.name: row.fingerprint for row in session.scalars(select(PoolKey))}
    for name, fingerprint in held.fingerprints().items():
        if name not in recorded:
            session.add(PoolKey(name=name, fingerprint=fingerprint, recorded_at=utcnow()))
            recorded[name] = fingerprint
    return mismatch(recorded, held)


def mismatch(recorded: dict[str, str], held: HeldKeys) -> str | None:
    """Why `held` is not the pool's set of keys `recorded` (one line naming the file to copy), or None."""
    advice = "copy it from the pool's first control plane (docs: High availability)"
    if recorded[MASTER_KEY] not in held.master_ids:
        return (f"{held.master_file} is not the pool's master key (key id {recorded[MASTER_KEY]}): {advice}; this "
                "control plane will not lead")
    if recorded[AGENT_CA] != held.ca_hash:
        return (f"{held.ca_file} is not the pool's agent CA ({recorded[AGENT_CA]}): {advice}, with its key; this "
                "control plane will not lead")
    if recorded[ORDER_KEY] != held.order_hash:
        return (f"{held.order_file} is not the pool's order-signing key ({recorded[ORDER_KEY]}): {advice}; this "
                "control plane will not lead")
    return None


def record_master_key(session: Session, key_id: str) -> None:
    """A master key rotation made `key_id` the pool's master key."""
    row = session.get(PoolKey, MASTER_KEY)
    if row is None:
        session.add(PoolKey(name=MASTER_KEY, fingerprint=key_id, recorded_at=utcnow()))
    else:
        row.fingerprint, row.recorded_at = key_id, utcnow()
