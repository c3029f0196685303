"""Step routes: where each step started and on what evidence (routing that learns)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-28 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0014"
down_revision = "0013"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("route", sa.JSON(), nullable=True))
    # The router reads a repository's finished steps by Job.repo.
    op.create_index("ix_jobs_repo", "jobs", ["repo"])


def downgrade() -> None:
    op.drop_index("ix_jobs_repo", table_name="jobs")
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_column("route")
