"""queues.hold_unsatisfiable (jobs no node of the pool could hold wait instead of being refused); nodes.address (where
other nodes reach a node: gangs' MASTER_ADDR and hostfile); allocations.rendezvous_port (the MASTER_PORT task 0's
agent chose)

Revision ID: 0013
Revises: 0012
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0013'
down_revision = '0012'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('queues', schema=None) as batch_op:
        batch_op.add_column(sa.Column('hold_unsatisfiable', sa.Boolean(), nullable=False, server_default=sa.false()))
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('address', sa.String(length=253), nullable=True))
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.add_column(sa.Column('rendezvous_port', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.drop_column('rendezvous_port')
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.drop_column('address')
    with op.batch_alter_table('queues', schema=None) as batch_op:
        batch_op.drop_column('hold_unsatisfiable')
