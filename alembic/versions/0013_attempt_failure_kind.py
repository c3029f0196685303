"""Attempt failure kind: why an attempt failed, stored rather than read from its error

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-27 14:00:00.000000
"""

from __future__ import annotations

import sqlalchemy as sa

from alembic import op

revision = "0013"
down_revision = "0012"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.add_column(sa.Column("failure_kind", sa.String(length=16), nullable=True))
    # Attempts that ended before this revision said "model unreachable: " in their error
    # when their model could not be used; they keep that meaning.
    op.execute(  # substr: case-sensitive on SQLite and Postgres alike, as the prefix was read
        "UPDATE attempts SET failure_kind = 'access' "
        "WHERE substr(error, 1, 19) = 'model unreachable: '"
    )


def downgrade() -> None:
    with op.batch_alter_table("attempts", schema=None) as batch_op:
        batch_op.drop_column("failure_kind")
