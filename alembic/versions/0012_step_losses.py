"""Step losses: every take-over from a lost worker, and the last one's time and worker

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-25 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0012"
down_revision = "0011"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("losses", sa.Integer(), server_default="0", nullable=False))
        batch_op.add_column(sa.Column("lost_at", sa.DateTime(), nullable=True))
        batch_op.add_column(sa.Column("lost_by", sa.String(length=128), nullable=True))
        batch_op.create_index(batch_op.f("ix_steps_lost_at"), ["lost_at"], unique=False)


def downgrade() -> None:
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_index(batch_op.f("ix_steps_lost_at"))
        batch_op.drop_column("lost_by")
        batch_op.drop_column("lost_at")
        batch_op.drop_column("losses")
