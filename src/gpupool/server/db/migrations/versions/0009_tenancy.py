"""tenancy: organisation ceilings, queue names per organisation, Idempotency-Keys per project and user, CPU and
memory in the ledger and their prices

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0009'
down_revision = '0008'
branch_labels = None
depends_on = None

#: SQLite's batch mode reflects 0001's unnamed UNIQUE constraints without names; this names them so they can go
SQLITE_NAMES = {"uq": "uq_%(table_name)s_%(column_0_N_name)s"}


def _unique(table: str, columns: str) -> str:
    """The name of 0001's unnamed UNIQUE constraint on `columns` ("a_b") of `table` in this database."""
    if op.get_bind().dialect.name == "postgresql":
        return f"{table}_{columns}_key"  # PostgreSQL's own naming
    return f"uq_{table}_{columns}"


def upgrade() -> None:
    with op.batch_alter_table('orgs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('ceiling', sa.JSON(), nullable=True))
    with op.batch_alter_table('queues', schema=None, naming_convention=SQLITE_NAMES) as batch_op:
        batch_op.drop_constraint(_unique('queues', 'name'), type_='unique')
        batch_op.create_unique_constraint('uq_queues_org_name', ['org_id', 'name'])
        batch_op.create_index('uq_queues_shared_name', ['name'], unique=True,
                              sqlite_where=sa.text('org_id IS NULL'), postgresql_where=sa.text('org_id IS NULL'))
    with op.batch_alter_table('jobs', schema=None, naming_convention=SQLITE_NAMES) as batch_op:
        batch_op.drop_constraint(_unique('jobs', 'org_id_idempotency_key'), type_='unique')
        batch_op.create_unique_constraint('uq_jobs_idempotency', ['project_id', 'user_id', 'idempotency_key'])
    with op.batch_alter_table('ledger', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cpu_milli', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('cpu_milli_seconds', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('memory_mib', sa.Integer(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('memory_mib_seconds', sa.BigInteger(), server_default='0', nullable=False))
    with op.batch_alter_table('usage_daily', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cpu_milli_seconds', sa.BigInteger(), server_default='0', nullable=False))
        batch_op.add_column(sa.Column('memory_mib_seconds', sa.BigInteger(), server_default='0', nullable=False))
    op.create_table('resource_prices',
                    sa.Column('resource', sa.String(length=16), nullable=False),
                    sa.Column('cents_per_hour', sa.Integer(), nullable=False),
                    sa.PrimaryKeyConstraint('resource'))


def downgrade() -> None:
    op.drop_table('resource_prices')
    with op.batch_alter_table('usage_daily', schema=None) as batch_op:
        batch_op.drop_column('memory_mib_seconds')
        batch_op.drop_column('cpu_milli_seconds')
    with op.batch_alter_table('ledger', schema=None) as batch_op:
        for column in ('memory_mib_seconds', 'memory_mib', 'cpu_milli_seconds', 'cpu_milli'):
            batch_op.drop_column(column)
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_constraint('uq_jobs_idempotency', type_='unique')
        batch_op.create_unique_constraint(_unique('jobs', 'org_id_idempotency_key'), ['org_id', 'idempotency_key'])
    with op.batch_alter_table('queues', schema=None) as batch_op:
        batch_op.drop_index('uq_queues_shared_name')
        batch_op.drop_constraint('uq_queues_org_name', type_='unique')
        batch_op.create_unique_constraint(_unique('queues', 'name'), ['name'])
    with op.batch_alter_table('orgs', schema=None) as batch_op:
        batch_op.drop_column('ceiling')
