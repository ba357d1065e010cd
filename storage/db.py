"""Engine, sessions and the one serialized write path.

SQLite by default, or PostgreSQL (postgresql+psycopg://...); the schema is
versioned by Alembic migrations (storage/migrations), run at start. With SQLite the database runs
in WAL mode so readers never wait for the writer; every write goes through
`Store.write`, which runs it on one dedicated thread, so writes never race
and each is one transaction: it happens whole or not at all. Telemetry is
buffered and written in batches, and a retention rule bounds its growth:
raw samples older than `retention_s` are dropped (the history that matters
for decisions, plans and events, is kept).
"""

from __future__ import annotations

import asyncio
import fcntl
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from alembic import command
from alembic.config import Config
from alembic.script import ScriptDirectory
from sqlalchemy import create_engine, delete, event, func, insert, inspect, select
from sqlalchemy.engine import Engine, make_url
from sqlalchemy.exc import DatabaseError
from sqlalchemy.orm import Session, sessionmaker

from .errors import StoreClosed, StoreError, StoreInUse
from .models import HistoryPoint, NicSample, TelemetrySample

T = TypeVar("T")

TELEMETRY_RETENTION_S = 3_600.0  # raw samples older than this are dropped
TRIM_EVERY_S = 10.0  # how often the retention rule runs (one indexed DELETE per table)
# Raw samples waiting for a flush, at most: about 50 MB, and six seconds of the largest job's
# devices (16,384) reporting every second. Past it, new ones are dropped and counted: one agent
# flooding telemetry must not grow the server's memory without bound.
MAX_PENDING_SAMPLES = 100_000


def make_engine(url: str) -> Engine:
    """An engine for `url` (SQLite tuned for one writer and many readers); not yet migrated."""
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

    return engine


MIGRATIONS = Path(__file__).parent / "migrations"


def _alembic(connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS))
    config.attributes["connection"] = connection
    return config


def migrate(engine: Engine, revision: str = "head") -> None:
    """Bring the database to this release's schema (storage/migrations), in one transaction. A
    database from before migrations (tables, no alembic_version) is first brought up to the
    baseline, revision 0001 (tables and columns it lacks added; nothing it holds touched), and
    marked as that."""
    with engine.begin() as connection:
        inspector = inspect(connection)
        if inspector.has_table("jobs") and not inspector.has_table("alembic_version"):
            config = _alembic(connection)
            baseline = ScriptDirectory.from_config(config).get_revision("0001").module.baseline()
            baseline.create_all(connection)  # tables it lacks
            _add_missing_columns(connection, baseline)
            command.stamp(config, "0001")
        command.upgrade(_alembic(connection), revision)


def _add_missing_columns(connection, metadata) -> None:
    """The columns of `metadata` an older database lacks, with their defaults."""
    inspector = inspect(connection)
    for table in metadata.sorted_tables:
        present = {c["name"] for c in inspector.get_columns(table.name)}
        for column in table.columns:
            if column.name in present:
                continue
            kind = column.type.compile(dialect=connection.dialect)
            default = column.default.arg if column.default is not None else None
            clause = f" DEFAULT {default!r}" if isinstance(default, (int, float, str)) else ""
            connection.exec_driver_sql(f'ALTER TABLE "{table.name}" ADD COLUMN "{column.name}" {kind}{clause}')


def sqlite_url(path: str) -> str:
    return f"sqlite:///{path}"


def _sqlite_file(url: str) -> str | None:
    engine_url = make_url(url)
    if engine_url.get_backend_name() != "sqlite" or engine_url.database in (None, "", ":memory:"):
        return None
    return engine_url.database


def check_free(path: str) -> None:
    """StoreInUse if a drover server holds the SQLite database at `path` now (nothing is held)."""
    if Path(f"{path}.lock").exists():
        _lock(path, create=True).close()


def _lock(path: str, create: bool):
    """An exclusive lock next to a SQLite file, held while the store is open: two servers on
    one database would each believe their own view of the cluster. The lock file outlives the
    server, so a database that goes missing later is noticed rather than silently recreated."""
    lock_path = Path(f"{path}.lock")
    if not Path(path).exists() and lock_path.exists() and not create:
        raise StoreError(
            f"database {path} is missing, but a drover server kept its history there "
            f"({lock_path} remains): restore it, or start with --new-db for an empty one"
        )
    handle = open(lock_path, "w")
    try:
        fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        handle.close()
        raise StoreInUse(f"database {path} is in use by another drover server") from None
    return handle


SERVER_LOCK = 0x64726F76  # "drov": the advisory lock a drover server holds on its PostgreSQL database


def _hold_server_lock(engine: Engine):
    """PostgreSQL's counterpart of the SQLite lock file: a session-level advisory lock, held on
    a connection of its own while the store is open; a second server on the database is refused."""
    connection = engine.connect()
    if not connection.exec_driver_sql(f"SELECT pg_try_advisory_lock({SERVER_LOCK})").scalar():
        connection.close()
        where = engine.url.render_as_string(hide_password=True)
        raise StoreInUse(f"database {where} is in use by another drover server")
    connection.commit()
    return connection


def _check_integrity(url: str, path: str) -> None:
    engine = create_engine(url)
    try:
        with engine.connect() as connection:
            verdict = connection.exec_driver_sql("PRAGMA quick_check").scalar()
    except DatabaseError as exc:
        raise StoreError(f"database {path} cannot be read ({exc.orig}): restore it from a backup") from None
    finally:
        engine.dispose()
    if verdict != "ok":
        raise StoreError(f"database {path} is corrupt (quick_check: {str(verdict)[:200]}): restore it from a backup")


class Store:
    def __init__(self, url: str, retention_s: float = TELEMETRY_RETENTION_S, create: bool = False):
        """`create`: make a new empty database where one that was used before has gone missing."""
        path = _sqlite_file(url)
        self._lock = _lock(path, create) if path else None
        self._held = None
        try:
            if path and Path(path).exists():
                _check_integrity(url, path)
            self.engine = make_engine(url)
            # Held before migrating: a second server must not alter the schema under the first.
            self._held = _hold_server_lock(self.engine) if self.engine.dialect.name == "postgresql" else None
            migrate(self.engine)
        except BaseException:
            for held in (self._lock, self._held):
                if held is not None:
                    held.close()
            if getattr(self, "engine", None) is not None:
                self.engine.dispose()  # PostgreSQL's session, and its advisory lock, end with it
            raise
        self.sessions = sessionmaker(self.engine, expire_on_commit=False)
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="drover-db-writer")
        # Reads run here, off the event loop; WAL lets them go on while the writer writes.
        self._readers = ThreadPoolExecutor(max_workers=4, thread_name_prefix="drover-db-reader")
        self._pending: list = []
        self._pending_lock = threading.Lock()
        self.closed = False
        self.dropped_samples = 0  # past MAX_PENDING_SAMPLES
        self.retention_s = retention_s
        self._last_trim = 0.0

    # -- writes: one thread, one transaction each -----------------------------

    def write_sync(self, fn: Callable[[Session], T]) -> T:
        return self._writer.submit(self._transaction, fn).result()

    async def write(self, fn: Callable[[Session], T]) -> T:
        return await self._run(self._writer, self._transaction, fn)

    async def _run(self, executor: ThreadPoolExecutor, call, fn):
        """On the store's thread. A request still being handled when the server stops met the
        executor shut down, and logged the RuntimeError as an ERROR: StoreClosed says what it is."""
        try:
            return await asyncio.get_running_loop().run_in_executor(executor, call, fn)
        except RuntimeError:
            if self.closed:
                raise StoreClosed("the control plane is stopping: its database is closed") from None
            raise

    def _transaction(self, fn: Callable[[Session], T]) -> T:
        with self.sessions.begin() as session:
            return fn(session)

    # -- telemetry: buffered, written in batches -------------------------------

    def buffer_samples(self, model, rows: list[dict]) -> None:
        """Queue rows (column -> value) of TelemetrySample, NicSample or HistoryPoint for the next
        flush (only the first two are trimmed by age, and dropped past MAX_PENDING_SAMPLES: a
        job's history, one point a step, is kept whole)."""
        with self._pending_lock:
            if model is not HistoryPoint:
                room = max(0, MAX_PENDING_SAMPLES - len(self._pending))
                self.dropped_samples += max(0, len(rows) - room)
                rows = rows[:room]
            self._pending.extend((model, row) for row in rows)

    @property
    def pending(self) -> int:
        return len(self._pending)

    async def flush_samples(self, also: Callable[[Session], None] | None = None) -> int:
        """Write the buffered samples, and `also` if given, in one transaction: one commit per
        flush keeps a busy control plane's writer cheap."""
        with self._pending_lock:
            rows, self._pending = self._pending, []
        trim = time.time() - self._last_trim >= TRIM_EVERY_S
        if rows or trim or also:
            try:  # shielded: a flush cancelled at shutdown still writes what it took
                await asyncio.shield(self.write(lambda s: self._insert_and_trim(s, rows, trim, also)))
            except asyncio.CancelledError:
                raise
            except Exception:
                with self._pending_lock:  # rolled back: keep the samples for the next flush
                    self._pending[:0] = rows
                raise
        return len(rows)

    def _insert_and_trim(self, session: Session, rows: list, trim: bool, also) -> None:
        if also:
            also(session)
        for model in (TelemetrySample, NicSample, HistoryPoint):
            batch = [row for kind, row in rows if kind is model]
            if batch:  # one executemany per table: thousands of rows a second stay cheap
                session.execute(insert(model), batch)
        if trim:
            self._last_trim = time.time()
            cutoff = self._last_trim - self.retention_s
            for model in (TelemetrySample, NicSample):
                session.execute(delete(model).where(model.time < cutoff))

    # -- reads ------------------------------------------------------------------

    def read(self, fn: Callable[[Session], T]) -> T:
        with self.sessions() as session:
            return fn(session)

    async def query(self, fn: Callable[[Session], T]) -> T:
        """`read` on a reader thread, for code on the event loop."""
        return await self._run(self._readers, self.read, fn)

    def count(self, model) -> int:
        return self.read(lambda s: s.scalar(select(func.count()).select_from(model)))

    def close(self) -> None:
        self.closed = True
        self._writer.shutdown(wait=True)
        self._readers.shutdown(wait=True)
        if self._lock is not None:
            self._lock.close()  # releases the lock
        if self._held is not None:
            # Let go of the advisory lock now: its session ends only once the server has seen the
            # connection close, and a store opened right after (a restart) found it still held.
            try:
                self._held.exec_driver_sql(f"SELECT pg_advisory_unlock({SERVER_LOCK})")
            except Exception:  # noqa: BLE001 - the server gone: the session, and its lock, with it
                pass
            self._held.close()
        self.engine.dispose()
