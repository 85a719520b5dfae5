"""agent client certificates and their denylist (mTLS on the agent channel)

Revision ID: 0005
Revises: 0004
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0005'
down_revision = '0004'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table('agent_certificates',
    sa.Column('serial', sa.String(length=40), nullable=False),
    sa.Column('node_id', sa.String(length=32), nullable=False),
    sa.Column('not_after', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.PrimaryKeyConstraint('serial')
    )
    with op.batch_alter_table('agent_certificates', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_agent_certificates_node_id'), ['node_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('agent_certificates', schema=None) as batch_op:
        batch_op.drop_index(batch_op.f('ix_agent_certificates_node_id'))
    op.drop_table('agent_certificates')
