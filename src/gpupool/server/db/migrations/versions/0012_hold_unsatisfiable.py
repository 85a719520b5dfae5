"""queues.hold_unsatisfiable: a queue whose jobs that no node of the pool could hold wait instead of being refused

Revision ID: 0012_hold_unsatisfiable
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012_hold_unsatisfiable'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('queues', schema=None) as batch_op:
        batch_op.add_column(sa.Column('hold_unsatisfiable', sa.Boolean(), nullable=False, server_default=sa.false()))


def downgrade() -> None:
    with op.batch_alter_table('queues', schema=None) as batch_op:
        batch_op.drop_column('hold_unsatisfiable')
