"""Kubernetes pods in the jobs and allocations tables: jobs.external_id (a pod's "k8s:" + uid, unique: a pod is
recorded once however often the scheduler restarts), allocations.node_id nullable with allocations.node_name and
allocations.gpu_model (a pod runs on a Kubernetes node, which has no row in nodes)

Revision ID: 0015
Revises: 0014
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0015'
down_revision = '0014'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.add_column(sa.Column('external_id', sa.String(length=64), nullable=True))
    op.create_index('uq_jobs_external_id', 'jobs', ['external_id'], unique=True)
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.alter_column('node_id', existing_type=sa.String(length=32), nullable=True)
        batch_op.add_column(sa.Column('node_name', sa.String(length=253), nullable=True))
        batch_op.add_column(sa.Column('gpu_model', sa.String(length=64), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('allocations', schema=None) as batch_op:
        batch_op.drop_column('gpu_model')
        batch_op.drop_column('node_name')
        batch_op.alter_column('node_id', existing_type=sa.String(length=32), nullable=False)
    op.drop_index('uq_jobs_external_id', table_name='jobs')
    with op.batch_alter_table('jobs', schema=None) as batch_op:
        batch_op.drop_column('external_id')
