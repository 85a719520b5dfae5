"""nodes.drain_since, drain_deadline, remove_when_drained: a node being drained (and removed once empty)

Revision ID: 0012
Revises: 0011
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0012'
down_revision = '0011'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('drain_since', sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column('drain_deadline', sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column('remove_when_drained', sa.Boolean(), server_default=sa.false(),
                                      nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.drop_column('remove_when_drained')
        batch_op.drop_column('drain_deadline')
        batch_op.drop_column('drain_since')
