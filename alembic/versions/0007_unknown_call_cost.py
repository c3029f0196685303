"""llm_calls.cost_usd may be null: a paid call whose price is unknown

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-24 12:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.alter_column("cost_usd", existing_type=sa.Float(), nullable=True)


def downgrade() -> None:
    op.execute("UPDATE llm_calls SET cost_usd = 0 WHERE cost_usd IS NULL")
    with op.batch_alter_table("llm_calls", schema=None) as batch_op:
        batch_op.alter_column("cost_usd", existing_type=sa.Float(), nullable=False)
