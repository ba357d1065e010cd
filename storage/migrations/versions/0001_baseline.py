"""The schema of the last release without migrations (0.1.0 until November 2026).

A database that release made has these tables and no alembic_version; storage/db.py
brings an even older one up to them (`baseline`: missing tables and columns added) and
marks it as this revision before upgrading. Frozen here: later changes are new revisions.

Revision ID: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def baseline() -> sa.MetaData:
    m = sa.MetaData()
    sa.Table(
        "nodes",
        m,
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("connected", sa.Boolean, nullable=False, default=False),
        sa.Column("drained", sa.Boolean, nullable=False, default=False),
        sa.Column("last_seen", sa.Float, nullable=False, default=0.0),
        sa.Column("agent_version", sa.String, nullable=False, default=""),
        sa.Column("probe_port", sa.Integer, nullable=False, default=0),
    )
    sa.Table(
        "devices",
        m,
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("node", sa.String, sa.ForeignKey("nodes.name"), nullable=False),
        sa.Column("kind", sa.String, nullable=False),
        sa.Column("name", sa.String, nullable=False, default=""),
        sa.Column("memory_gib", sa.Float, nullable=False, default=0.0),
        sa.Column("tflops", sa.Float, nullable=False, default=0.0),
        sa.Column("intra_gbps", sa.Float, nullable=False, default=0.0),
    )
    sa.Table(
        "nics",
        m,
        sa.Column("node", sa.String, sa.ForeignKey("nodes.name"), primary_key=True),
        sa.Column("name", sa.String, primary_key=True),
        sa.Column("type", sa.String, nullable=False),
        sa.Column("gbps", sa.Float, nullable=False, default=0.0),
        sa.Column("address", sa.String, nullable=False, default=""),
        sa.Column("measured_gbps", sa.Float, nullable=False, default=0.0),
    )
    sa.Table(
        "links",
        m,
        sa.Column("node", sa.String, primary_key=True),
        sa.Column("nic", sa.String, primary_key=True),
        sa.Column("peer", sa.String, primary_key=True),
        sa.Column("gbps", sa.Float, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Index("links_by_peer", "peer"),
    )
    sa.Table(
        "jobs",
        m,
        sa.Column("id", sa.String, primary_key=True),
        sa.Column("state", sa.String, nullable=False),
        sa.Column("model_yaml", sa.Text, nullable=False),
        sa.Column("model_name", sa.String, nullable=False),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("seed", sa.Integer, nullable=False),
        sa.Column("out_dir", sa.String, nullable=False),
        sa.Column("step", sa.Integer, nullable=False, default=-1),
        sa.Column("plan_version", sa.Integer, nullable=False, default=0),
        sa.Column("committed_plan_version", sa.Integer, nullable=False, default=0),
        sa.Column("detail", sa.Text, nullable=False, default=""),
        sa.Column("created", sa.Float, nullable=False),
        sa.Column("ranks_json", sa.Text, nullable=False, default="{}"),
        sa.Column("master_addr", sa.String, nullable=False, default="127.0.0.1"),
        sa.Column("master_port", sa.Integer, nullable=False, default=0),
    )
    sa.Table(
        "job_progress",
        m,
        sa.Column("job_id", sa.String, sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("progress_json", sa.Text, nullable=False),
    )
    sa.Table(
        "plans",
        m,
        sa.Column("job_id", sa.String, sa.ForeignKey("jobs.id"), primary_key=True),
        sa.Column("version", sa.Integer, primary_key=True),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("plan_json", sa.Text, nullable=False),
        sa.Column("predicted_samples_per_s", sa.Float, nullable=False, default=0.0),
        sa.Column("rates_json", sa.Text, nullable=False, default="{}"),
        sa.Column("committed", sa.Boolean, nullable=False, default=False),
        sa.Column("created", sa.Float, nullable=False),
    )
    sa.Table(
        "telemetry",
        m,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String, nullable=False),
        sa.Column("device", sa.String, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("compute_s_per_block", sa.Float, nullable=False),
        sa.Column("p2p_wait_s", sa.Float, nullable=False, default=0.0),
        sa.Column("grad_sync_s", sa.Float, nullable=False, default=0.0),
        sa.Column("rate", sa.Float, nullable=False, default=1.0),
        sa.Index("telemetry_by_device", "job_id", "device", "id"),
        sa.Index("telemetry_by_time", "time"),
    )
    sa.Table(
        "nic_samples",
        m,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("node", sa.String, nullable=False),
        sa.Column("nic", sa.String, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("tx_bytes_per_s", sa.Float, nullable=False),
        sa.Column("rx_bytes_per_s", sa.Float, nullable=False),
        sa.Index("nic_samples_by_nic", "node", "nic", "id"),
        sa.Index("nic_samples_by_time", "time"),
    )
    sa.Table(
        "events",
        m,
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("job_id", sa.String, nullable=False),
        sa.Column("time", sa.Float, nullable=False),
        sa.Column("step", sa.Integer, nullable=False),
        sa.Column("kind", sa.String, nullable=False),
        sa.Column("details_json", sa.Text, nullable=False, default="{}"),
        sa.Index("ix_events_job_id", "job_id"),
    )
    return m


def upgrade() -> None:
    baseline().create_all(op.get_bind())


def downgrade() -> None:
    baseline().drop_all(op.get_bind())
