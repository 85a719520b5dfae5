"""nodes.jobs_as: who a node's process jobs run as, as its agent says (dynamic-uid, local-user, agent-user, root)

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0010'
down_revision = '0009'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.add_column(sa.Column('jobs_as', sa.String(length=16), server_default='unknown', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('nodes', schema=None) as batch_op:
        batch_op.drop_column('jobs_as')
