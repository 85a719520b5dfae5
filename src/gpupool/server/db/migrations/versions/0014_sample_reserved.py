"""cluster_samples.reserved: GPUs idle but held by a reservation for a waiting job (the dashboard's SOR)

Revision ID: 0014
Revises: 0013
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0014'
down_revision = '0013'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('cluster_samples', schema=None) as batch_op:
        batch_op.add_column(sa.Column('reserved', sa.Float(), server_default='0', nullable=False))


def downgrade() -> None:
    with op.batch_alter_table('cluster_samples', schema=None) as batch_op:
        batch_op.drop_column('reserved')
