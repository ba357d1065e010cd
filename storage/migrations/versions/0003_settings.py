"""Control-plane-wide settings that outlive a restart (drover detect pause).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "settings",
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("value_json", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("settings")
