"""worker_beats: which workers are alive, for the no-worker notices

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "worker_beats",
        sa.Column("name", sa.String(length=200), nullable=False),
        sa.Column("queues", sa.String(length=200), nullable=False),
        sa.Column("started_at", sa.DateTime(), nullable=False),
        sa.Column("last_seen", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_worker_beats")),
    )


def downgrade() -> None:
    op.drop_table("worker_beats")
