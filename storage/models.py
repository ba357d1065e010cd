"""The control plane's history as SQLAlchemy tables. A change here is also a new revision in
storage/migrations/versions (tests/storage check the two agree, on SQLite and PostgreSQL)."""

from __future__ import annotations

from sqlalchemy import BigInteger, Boolean, Float, ForeignKey, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, relationship

# Steps, seeds and sample ids outgrow 32 bits (PostgreSQL's INTEGER); SQLite's are 64-bit.
INT64 = BigInteger().with_variant(Integer(), "sqlite")


class Base(DeclarativeBase):
    pass


class Node(Base):
    __tablename__ = "nodes"
    name: Mapped[str] = mapped_column(String, primary_key=True)
    connected: Mapped[bool] = mapped_column(Boolean, default=False)
    drained: Mapped[bool] = mapped_column(Boolean, default=False)
    last_seen: Mapped[float] = mapped_column(Float, default=0.0)
    agent_version: Mapped[str] = mapped_column(String, default="")
    probe_port: Mapped[int] = mapped_column(Integer, default=0)  # where its agent answers link probes; 0: none


class Device(Base):
    __tablename__ = "devices"
    id: Mapped[str] = mapped_column(String, primary_key=True)  # NODE/INDEX
    node: Mapped[str] = mapped_column(ForeignKey("nodes.name"))
    kind: Mapped[str] = mapped_column(String)
    name: Mapped[str] = mapped_column(String, default="")
    memory_gib: Mapped[float] = mapped_column(Float, default=0.0)
    tflops: Mapped[float] = mapped_column(Float, default=0.0)
    intra_gbps: Mapped[float] = mapped_column(Float, default=0.0)  # to the node's other devices; 0: unknown


class Nic(Base):
    __tablename__ = "nics"
    node: Mapped[str] = mapped_column(ForeignKey("nodes.name"), primary_key=True)
    name: Mapped[str] = mapped_column(String, primary_key=True)
    type: Mapped[str] = mapped_column(String)
    gbps: Mapped[float] = mapped_column(Float, default=0.0)  # nominal, as the agent reports it
    address: Mapped[str] = mapped_column(String, default="")
    measured_gbps: Mapped[float] = mapped_column(Float, default=0.0)  # from link probes (Link); 0: none yet


class Link(Base):
    """The newest probe from a node's NIC to a peer (over the network that NIC is on)."""

    __tablename__ = "links"
    node: Mapped[str] = mapped_column(String, primary_key=True)
    nic: Mapped[str] = mapped_column(String, primary_key=True)
    peer: Mapped[str] = mapped_column(String, primary_key=True)
    gbps: Mapped[float] = mapped_column(Float)
    time: Mapped[float] = mapped_column(Float)
    __table_args__ = (Index("links_by_peer", "peer"),)  # a NIC's measure reads the links to its node too


class Job(Base):
    __tablename__ = "jobs"
    id: Mapped[str] = mapped_column(String, primary_key=True)
    state: Mapped[str] = mapped_column(String)  # pending | running | completed | failed | cancelled
    model_yaml: Mapped[str] = mapped_column(Text)
    model_name: Mapped[str] = mapped_column(String)
    steps: Mapped[int] = mapped_column(INT64)
    seed: Mapped[int] = mapped_column(INT64)
    out_dir: Mapped[str] = mapped_column(String)
    step: Mapped[int] = mapped_column(INT64, default=-1)
    plan_version: Mapped[int] = mapped_column(Integer, default=0)  # desired generation
    committed_plan_version: Mapped[int] = mapped_column(Integer, default=0)  # observed by every agent
    detail: Mapped[str] = mapped_column(Text, default="")
    created: Mapped[float] = mapped_column(Float)
    ranks_json: Mapped[str] = mapped_column(Text, default="{}")  # device id -> rank, fixed for the job
    master_addr: Mapped[str] = mapped_column(String, default="127.0.0.1")
    master_port: Mapped[int] = mapped_column(Integer, default=0)
    # Loaded with the job: every read of a job shows its progress.
    progress: Mapped[JobProgress | None] = relationship(lazy="joined", uselist=False)


class JobProgress(Base):
    """A job's newest training figures (loss, lr, tokens/s, validation loss), as JSON: a table
    of its own, so a database made before it gains it without a migration."""

    __tablename__ = "job_progress"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    progress_json: Mapped[str] = mapped_column(Text)


class Plan(Base):
    __tablename__ = "plans"
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    version: Mapped[int] = mapped_column(Integer, primary_key=True)
    reason: Mapped[str] = mapped_column(Text)
    plan_json: Mapped[str] = mapped_column(Text)
    predicted_samples_per_s: Mapped[float] = mapped_column(Float, default=0.0)
    rates_json: Mapped[str] = mapped_column(Text, default="{}")  # the straggling rates it was made for
    committed: Mapped[bool] = mapped_column(Boolean, default=False)
    created: Mapped[float] = mapped_column(Float)


class TelemetrySample(Base):
    __tablename__ = "telemetry"
    id: Mapped[int] = mapped_column(INT64, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String)
    device: Mapped[str] = mapped_column(String)
    time: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(INT64)
    compute_s_per_block: Mapped[float] = mapped_column(Float)
    p2p_wait_s: Mapped[float] = mapped_column(Float, default=0.0)
    grad_sync_s: Mapped[float] = mapped_column(Float, default=0.0)
    rate: Mapped[float] = mapped_column(Float, default=1.0)
    __table_args__ = (Index("telemetry_by_device", "job_id", "device", "id"), Index("telemetry_by_time", "time"))


class HistoryPoint(Base):
    """A running job's figures at a step, kept for its whole life (raw telemetry is trimmed
    after an hour): training progress as rank 0's agent reported it, and every device's
    straggling rate as the detector judged it then. One a progress report (about one per
    telemetry interval), what `drover report` draws."""

    __tablename__ = "job_history"
    id: Mapped[int] = mapped_column(INT64, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String)
    step: Mapped[int] = mapped_column(INT64)
    time: Mapped[float] = mapped_column(Float)
    loss: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: not finite (diverged)
    lr: Mapped[float] = mapped_column(Float)
    samples_per_s: Mapped[float] = mapped_column(Float)
    plan_version: Mapped[int] = mapped_column(Integer)
    rates_json: Mapped[str] = mapped_column(Text, default="{}")  # device -> rate
    __table_args__ = (Index("history_by_job", "job_id", "id"),)


class NicSample(Base):
    __tablename__ = "nic_samples"
    id: Mapped[int] = mapped_column(INT64, primary_key=True, autoincrement=True)
    node: Mapped[str] = mapped_column(String)
    nic: Mapped[str] = mapped_column(String)
    time: Mapped[float] = mapped_column(Float)
    tx_bytes_per_s: Mapped[float] = mapped_column(Float)
    rx_bytes_per_s: Mapped[float] = mapped_column(Float)
    __table_args__ = (Index("nic_samples_by_nic", "node", "nic", "id"), Index("nic_samples_by_time", "time"))


class Event(Base):
    __tablename__ = "events"
    id: Mapped[int] = mapped_column(INT64, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String, index=True)
    time: Mapped[float] = mapped_column(Float)
    step: Mapped[int] = mapped_column(INT64)
    kind: Mapped[str] = mapped_column(String)
    details_json: Mapped[str] = mapped_column(Text, default="{}")


class Setting(Base):
    """A control-plane-wide setting that outlives a restart (detection paused), as JSON."""

    __tablename__ = "settings"
    name: Mapped[str] = mapped_column(String, primary_key=True)
    value_json: Mapped[str] = mapped_column(Text)
