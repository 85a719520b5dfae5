"""pool_keys: the fingerprints of the keys every control plane of the pool must hold; queues.max_disconnect_s

Revision ID: 0011
Revises: 0010
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0011'
down_revision = '0010'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'pool_keys',
        sa.Column('name', sa.String(length=32), nullable=False),
        sa.Column('fingerprint', sa.String(length=128), nullable=False),
        sa.Column('recorded_at', sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint('name'),
    )
    with op.batch_alter_table('queues', schema=None) as batch_op:
        batch_op.add_column(sa.Column('max_disconnect_s', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('queues', schema=None) as batch_op:
        batch_op.drop_column('max_disconnect_s')
    op.drop_table('pool_keys')
