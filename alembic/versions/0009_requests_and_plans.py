"""Jobs made from a request: the request, its plan, a question's answer; job-wide calls

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 14:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.add_column(sa.Column("request", sa.Text(), nullable=True))
        batch_op.add_column(sa.Column("plan", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("answer", sa.Text(), nullable=True))
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.alter_column("step_id", existing_type=sa.Integer(), nullable=True)
        batch_op.alter_column("attempt_id", existing_type=sa.Integer(), nullable=True)


def downgrade() -> None:
    op.execute("DELETE FROM llm_calls WHERE attempt_id IS NULL")
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.alter_column("attempt_id", existing_type=sa.Integer(), nullable=False)
        batch_op.alter_column("step_id", existing_type=sa.Integer(), nullable=False)
    with op.batch_alter_table("jobs", schema=None) as batch_op:
        batch_op.drop_column("answer")
        batch_op.drop_column("plan")
        batch_op.drop_column("request")
