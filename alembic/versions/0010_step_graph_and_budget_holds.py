"""Steps as a graph: each step's failure policy; budget holds of calls in flight

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 16:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.add_column(
            sa.Column("on_failure", sa.String(length=16), nullable=False, server_default="stop")
        )
    op.create_table(
        "budget_holds",
        sa.Column("id", sa.Integer(), autoincrement=True, nullable=False),
        sa.Column("job_id", sa.String(length=32), nullable=False),
        sa.Column("amount_usd", sa.Float(), nullable=False),
        sa.Column("expires_at", sa.DateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_budget_holds")),
    )
    op.create_index(op.f("ix_budget_holds_job_id"), "budget_holds", ["job_id"], unique=False)


def downgrade() -> None:
    op.drop_index(op.f("ix_budget_holds_job_id"), table_name="budget_holds")
    op.drop_table("budget_holds")
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_column("on_failure")
