"""audit.client_request_id, pruning of audit rows past the retention, tokens.session_of (dashboard sessions)

The audit table stays append-only for a day: its triggers now let a DELETE through for rows older than that (the
retention setting is at least a day), so the control plane can prune rows past the retention while a bug or a
stray statement still cannot remove recent ones. UPDATE and TRUNCATE stay refused.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None

#: the youngest an audit row may be and still be deleted (the least retention gpupool.server.settings allows)
PRUNABLE_AFTER = "1 day"

SQLITE_UPGRADE = [
    "DROP TRIGGER IF EXISTS audit_no_DELETE",
    # `at` is stored as 'YYYY-MM-DD HH:MM:SS.ffffff' in UTC, which compares as text with datetime('now', ...)
    "CREATE TRIGGER audit_no_DELETE BEFORE DELETE ON audit WHEN OLD.at > datetime('now', '-" + PRUNABLE_AFTER + "') "
    "BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END",
]
#: 0003's triggers again: the batch copy of the table that drops its column on SQLite does not keep them
SQLITE_DOWNGRADE = [
    statement for verb in ("UPDATE", "DELETE") for statement in (
        f"DROP TRIGGER IF EXISTS audit_no_{verb}",
        f"CREATE TRIGGER audit_no_{verb} BEFORE {verb} ON audit BEGIN SELECT RAISE(ABORT, 'audit is append-only'); END")
]
POSTGRES_UPGRADE = [
    "CREATE OR REPLACE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN "
    "IF TG_OP = 'DELETE' THEN IF OLD.at < now() - interval '" + PRUNABLE_AFTER + "' THEN RETURN OLD; END IF; END IF; "
    "RAISE EXCEPTION 'audit is append-only'; END $$",
]
POSTGRES_DOWNGRADE = [
    "CREATE OR REPLACE FUNCTION audit_append_only() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN RAISE EXCEPTION 'audit is append-only'; END $$",
]


def _run(sqlite: list[str], postgres: list[str]) -> None:
    dialect = op.get_bind().dialect.name
    for statement in sqlite if dialect == 'sqlite' else postgres if dialect == 'postgresql' else []:
        op.execute(statement)


def upgrade() -> None:
    with op.batch_alter_table('audit', schema=None) as batch_op:
        batch_op.add_column(sa.Column('client_request_id', sa.String(length=64), server_default='', nullable=False))
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.add_column(sa.Column('session_of', sa.String(length=32), nullable=True))
    _run(SQLITE_UPGRADE, POSTGRES_UPGRADE)


def downgrade() -> None:
    with op.batch_alter_table('tokens', schema=None) as batch_op:
        batch_op.drop_column('session_of')
    with op.batch_alter_table('audit', schema=None) as batch_op:
        batch_op.drop_column('client_request_id')
    _run(SQLITE_DOWNGRADE, POSTGRES_DOWNGRADE)
