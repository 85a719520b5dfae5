"""Join tokens (RELIABILITY.md §2.2, S7 cases 5 and 6): `id.secret`, a public id and a secret of at least 256 random
bits, stored only as the secret's SHA-256 hash. Registration with one end to end: tests/server/test_api.py and S7."""

from __future__ import annotations

import re
from pathlib import Path

from sqlalchemy import select

from gpupool.protocol import api
from gpupool.protocol.agent import Registration
from gpupool.server import guard
from gpupool.server.auth import Principal, hash_secret
from gpupool.server.db.engine import Database, migrate
from gpupool.server.db.models import JoinToken
from gpupool.server.services import tenancy

SHAPE = re.compile(r"^(?P<id>[0-9a-f]{16})\.(?P<secret>[0-9a-f]{64})$")


def test_join_tokens_carry_256_secret_bits_and_only_their_hash_is_stored(tmp_path: Path) -> None:
    db = Database(f"sqlite:///{tmp_path / 't.db'}")
    migrate(db.url)
    operator = Principal(role="operator")
    with db.session() as session:
        tokens = [tenancy.create_join_token(session, operator, api.JoinTokenCreate()).token for _ in range(50)]
    assert tenancy.JOIN_TOKEN_SECRET_BYTES * 8 >= 256
    shapes = [SHAPE.match(token) for token in tokens]
    assert all(shapes), tokens[:3]
    secrets_ = {m["secret"] for m in shapes if m}
    assert len(secrets_) == len({m["id"] for m in shapes if m}) == 50
    with db.session() as session:
        rows = {row.id: row.secret_hash for row in session.scalars(select(JoinToken))}
    assert rows == {m["id"]: hash_secret(m["secret"]) for m in shapes if m}
    assert not any(secret in str(rows) for secret in secrets_)
    for token in tokens[:3]:  # what the agent sends and the audit log names
        assert Registration(join_token=token, name="n", boot_id="b", cpu_milli=1, memory_mib=1).join_token == token
        assert guard.join_token_id(token) == token.partition(".")[0]
    db.engine.dispose()
