"""Each job's history (job_history, for drover report), and 64-bit steps, seeds and ids.

SQLite's integers are 64-bit already; on PostgreSQL INTEGER is 32-bit, which a seed up to
2^63 - 1, a step count up to 2^40 or a telemetry id after a few days at 8,000 samples a
second outgrow.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None

INT64 = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
WIDENED = {
    "jobs": ["steps", "seed", "step"],
    "telemetry": ["id", "step"],
    "nic_samples": ["id"],
    "events": ["id", "step"],
}


def upgrade() -> None:
    op.create_table(
        "job_history",
        sa.Column("id", INT64, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String, nullable=False),
        sa.Column("step", INT64, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("loss", sa.Float, nullable=True),
        sa.Column("lr", sa.Float, nullable=False),
        sa.Column("samples_per_s", sa.Float, nullable=False),
        sa.Column("plan_version", sa.Integer, nullable=False),
        sa.Column("rates_json", sa.Text, nullable=False),
    )
    op.create_index("history_by_job", "job_history", ["job_id", "id"])
    if op.get_bind().dialect.name != "sqlite":
        for table, columns in WIDENED.items():
            for column in columns:
                op.alter_column(table, column, type_=sa.BigInteger(), existing_type=sa.Integer())
            if "id" in columns:  # SERIAL's sequence stays a 32-bit one unless told
                op.execute(f"ALTER SEQUENCE {table}_id_seq AS bigint")


def downgrade() -> None:
    if op.get_bind().dialect.name != "sqlite":
        for table, columns in WIDENED.items():
            if "id" in columns:
                op.execute(f"ALTER SEQUENCE {table}_id_seq AS integer")
            for column in columns:
                op.alter_column(table, column, type_=sa.Integer(), existing_type=sa.BigInteger())
    op.drop_index("history_by_job", "job_history")
    op.drop_table("job_history")
