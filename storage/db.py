"""Engine, sessions and the one serialized write path.

SQLite by default (any SQLAlchemy URL works). With SQLite the database runs
in WAL mode so readers never wait for the writer; every write goes through
`Store.write`, which runs it on one dedicated thread, so writes never race
and each is one transaction: it happens whole or not at all. Telemetry is
buffered and written in batches, and a retention rule bounds its growth.
"""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from typing import Callable, TypeVar

from sqlalchemy import create_engine, delete, event, func, select
from sqlalchemy.engine import Engine
from sqlalchemy.orm import Session, sessionmaker

from .models import Base, NicSample, TelemetrySample

T = TypeVar("T")

TELEMETRY_KEEP_PER_DEVICE = 2_000  # raw samples kept per (job, device); older ones are dropped


def make_engine(url: str) -> Engine:
    engine = create_engine(url)
    if engine.dialect.name == "sqlite":
        @event.listens_for(engine, "connect")
        def _pragmas(dbapi_connection, _record):
            cursor = dbapi_connection.cursor()
            cursor.execute("PRAGMA journal_mode=WAL")
            cursor.execute("PRAGMA synchronous=NORMAL")
            cursor.execute("PRAGMA foreign_keys=ON")
            cursor.execute("PRAGMA busy_timeout=5000")
            cursor.close()
    Base.metadata.create_all(engine)
    return engine


def sqlite_url(path: str) -> str:
    return f"sqlite:///{path}"


class Store:
    def __init__(self, url: str, keep_per_device: int = TELEMETRY_KEEP_PER_DEVICE):
        self.engine = make_engine(url)
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drover-db-writer")
        self._pending: list = []
        self._pending_lock = threading.Lock()
        self.keep_per_device = keep_per_device

    # -- writes: one thread, one transaction each -----------------------------

    def write_sync(self, fn: Callable[[Session], T]) -> T:
        return self._writer.submit(self._transaction, fn).result()

    async def write(self, fn: Callable[[Session], T]) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._writer, self._transaction, fn)

    def _transaction(self, fn: Callable[[Session], T]) -> T:
        with self.sessions.begin() as session:
            return fn(session)

    # -- telemetry: buffered, written in batches -------------------------------

    def buffer_samples(self, rows: list) -> None:
        """Queue TelemetrySample / NicSample rows for the next flush."""
        with self._pending_lock:
            self._pending.extend(rows)

    async def flush_samples(self) -> int:
        with self._pending_lock:
            rows, self._pending = self._pending, []
        if rows:
            await self.write(lambda s: self._insert_and_trim(s, rows))
        return len(rows)

    def _insert_and_trim(self, session: Session, rows: list) -> None:
        session.add_all(rows)
        session.flush()
        series = {(TelemetrySample, (r.job_id, r.device)) for r in rows if isinstance(r, TelemetrySample)}
        series |= {(NicSample, (r.node, r.nic)) for r in rows if isinstance(r, NicSample)}
        for model, key in series:
            self._trim(session, model, key)

    def _trim(self, session: Session, model, key: tuple) -> None:
        """Keep the newest `keep_per_device` rows of one series."""
        columns = (model.job_id, model.device) if model is TelemetrySample else (model.node, model.nic)
        match = [column == value for column, value in zip(columns, key)]
        cutoff = session.scalar(select(model.id).where(*match).order_by(model.id.desc())
                                .offset(self.keep_per_device).limit(1))
        if cutoff is not None:
            session.execute(delete(model).where(*match, model.id <= cutoff))

    # -- reads ------------------------------------------------------------------

    def read(self, fn: Callable[[Session], T]) -> T:
        with self.sessions() as session:
            return fn(session)

    def count(self, model) -> int:
        return self.read(lambda s: s.scalar(select(func.count()).select_from(model)))

    def close(self) -> None:
        self._writer.shutdown(wait=True)
        self.engine.dispose()
