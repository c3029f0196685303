"""Agents: each step's resolved agent definition, and how it was chosen

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 15:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0011"
down_revision = "0010"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.add_column(sa.Column("agent_spec", sa.JSON(), nullable=True))
        batch_op.add_column(sa.Column("agent_choice", sa.String(length=16), nullable=True))
        batch_op.add_column(sa.Column("agent_score", sa.Float(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("steps", schema=None) as batch_op:
        batch_op.drop_column("agent_score")
        batch_op.drop_column("agent_choice")
        batch_op.drop_column("agent_spec")
