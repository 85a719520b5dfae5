"""usage rolled up per day; 64-bit ledger amounts

An hour of 8 GPUs at $3/GPU-hour is 8.6e9 micro-cents, beyond PostgreSQL's 32-bit integer: the ledger's
amounts become BIGINT. `usage_daily` is filled from the existing ledger.

Revision ID: 0004
Revises: 0003
"""

from __future__ import annotations

import json
from collections import defaultdict
from datetime import UTC, datetime

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None

GROUP = ("org_id", "project_id", "user_id", "queue", "model")


def upgrade() -> None:
    with op.batch_alter_table('ledger', schema=None) as batch_op:
        batch_op.alter_column('gpu_milli_seconds', type_=sa.BigInteger(), existing_nullable=False)
        batch_op.alter_column('cost_micro_cents', type_=sa.BigInteger(), existing_nullable=False)
        batch_op.create_index('ix_ledger_start', ['start'], unique=False)
    table = op.create_table(
        'usage_daily',
        sa.Column('id', sa.Integer(), autoincrement=True, nullable=False),
        sa.Column('day', sa.DateTime(timezone=True), nullable=False),
        sa.Column('org_id', sa.String(length=32), nullable=False),
        sa.Column('project_id', sa.String(length=32), nullable=False),
        sa.Column('user_id', sa.String(length=32), nullable=False),
        sa.Column('queue', sa.String(length=64), nullable=False),
        sa.Column('model', sa.String(length=64), nullable=False),
        sa.Column('tags', sa.JSON(), nullable=False),
        sa.Column('tags_key', sa.String(length=512), nullable=False),
        sa.Column('gpu_milli_seconds', sa.BigInteger(), nullable=False),
        sa.Column('cost_micro_cents', sa.BigInteger(), nullable=False),
        sa.Column('entries', sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(['org_id'], ['orgs.id']),
        sa.ForeignKeyConstraint(['project_id'], ['projects.id']),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('day', 'org_id', 'project_id', 'user_id', 'queue', 'model', 'tags_key',
                            name='uq_usage_daily_group'),
    )
    with op.batch_alter_table('usage_daily', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_usage_daily_day'), ['day'], unique=False)
    _backfill(table)


def _backfill(table: sa.Table) -> None:
    ledger = sa.table('ledger', *[sa.column(c) for c in (*GROUP, 'tags', 'start', 'gpu_milli_seconds',
                                                          'cost_micro_cents')])
    sums: dict[tuple[object, ...], list[int]] = defaultdict(lambda: [0, 0, 0])
    tags_of: dict[str, object] = {}
    for row in op.get_bind().execute(sa.select(ledger)).mappings():
        start = row['start'] if isinstance(row['start'], datetime) else datetime.fromisoformat(str(row['start']))
        tags = row['tags'] if isinstance(row['tags'], dict) else json.loads(row['tags'] or '{}')
        key = json.dumps(tags, sort_keys=True, separators=(',', ':'))
        tags_of[key] = tags
        day = start.replace(hour=0, minute=0, second=0, microsecond=0, tzinfo=start.tzinfo or UTC)
        total = sums[(day, *(row[c] for c in GROUP), key)]
        total[0] += row['gpu_milli_seconds']
        total[1] += row['cost_micro_cents']
        total[2] += 1
    rows = [dict(zip(('day', *GROUP, 'tags_key'), k, strict=True), tags=tags_of[k[-1]], gpu_milli_seconds=v[0],
                 cost_micro_cents=v[1], entries=v[2]) for k, v in sums.items()]
    if rows:
        op.bulk_insert(table, rows)


def downgrade() -> None:
    with op.batch_alter_table('usage_daily', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_usage_daily_day'))
    op.drop_table('usage_daily')
    with op.batch_alter_table('ledger', schema=None) as batch_op:
        batch_op.drop_index('ix_ledger_start')
        batch_op.alter_column('gpu_milli_seconds', type_=sa.Integer(), existing_nullable=False)
        batch_op.alter_column('cost_micro_cents', type_=sa.Integer(), existing_nullable=False)
