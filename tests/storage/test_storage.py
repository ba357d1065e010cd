"""Storage over a real SQLite file and a real PostgreSQL server (each test that is not about
one of them runs on both): one write path, plan versions, bounded telemetry, history that
survives reopening, and a schema versioned by migrations that upgrade older databases."""

from __future__ import annotations

import asyncio
import sqlite3
import time

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine

from drover.storage import queries
from drover.storage.db import Store, StoreError, StoreInUse, migrate, sqlite_url
from drover.storage.models import Base, HistoryPoint, Job, TelemetrySample


def new_job(session, job_id="j1"):
    session.add(
        Job(
            id=job_id,
            state="running",
            model_yaml="{}",
            model_name="tiny",
            steps=10,
            seed=0,
            out_dir="/tmp",
            created=time.time(),
        )
    )


@pytest.fixture
def store(database_url):
    s = Store(database_url, retention_s=60.0)
    yield s
    s.close()


def test_wal_mode(tmp_path):
    store = Store(sqlite_url(tmp_path / "drover.db"))
    store.write_sync(new_job)
    assert sqlite3.connect(tmp_path / "drover.db").execute("PRAGMA journal_mode").fetchone()[0] == "wal"


def test_plan_versions_increase_and_commit(store):
    store.write_sync(new_job)
    v1 = store.write_sync(lambda s: queries.add_plan(s, "j1", {"pipelines": []}, "initial").version)
    v2 = store.write_sync(lambda s: queries.add_plan(s, "j1", {"pipelines": []}, "straggler").version)
    assert (v1, v2) == (1, 2)
    assert store.write_sync(lambda s: queries.commit_plan(s, "j1", 2)) is True
    assert store.write_sync(lambda s: queries.commit_plan(s, "j1", 2)) is False
    job = store.read(lambda s: queries.get_job(s, "j1"))
    assert (job.plan_version, job.committed_plan_version) == (2, 2)
    with pytest.raises(queries.NotFound):
        store.write_sync(lambda s: queries.add_plan(s, "nope", {}, "x"))


def test_failed_write_leaves_nothing_half_written(store):
    store.write_sync(new_job)

    def half(session):
        queries.add_plan(session, "j1", {"pipelines": []}, "first")
        raise RuntimeError("crash in the middle")

    with pytest.raises(RuntimeError):
        store.write_sync(half)
    assert store.read(lambda s: queries.plans(s, "j1")) == []
    assert store.read(lambda s: queries.get_job(s, "j1")).plan_version == 0


def test_telemetry_batched_and_bounded_by_age(store):
    now = time.time()

    async def run():
        for step in range(12):  # steps 0-5 are two minutes old, past the 60 s retention
            age = 120.0 if step < 6 else 0.0
            store.buffer_samples(
                TelemetrySample, [dict(job_id="j1", device="n/0", time=now - age, step=step, compute_s_per_block=0.1)]
            )
        assert await store.flush_samples() == 12

    asyncio.run(run())
    kept = store.read(lambda s: queries.telemetry(s, "j1", "n/0"))
    assert [t.step for t in kept] == [11, 10, 9, 8, 7, 6]


def test_samples_waiting_past_the_cap_are_dropped_and_counted_but_history_is_kept(store, monkeypatch):
    monkeypatch.setattr("drover.storage.db.MAX_PENDING_SAMPLES", 5)
    sample = dict(job_id="j1", device="n/0", time=time.time(), step=1, compute_s_per_block=0.1)
    store.buffer_samples(TelemetrySample, [sample] * 4)
    store.buffer_samples(TelemetrySample, [sample] * 3)  # one agent flooding
    store.buffer_samples(HistoryPoint, [dict(job_id="j1", step=1, time=time.time(), loss=1.0)])
    assert (store.pending, store.dropped_samples) == (6, 2)


def test_flush_is_one_transaction_and_keeps_samples_it_could_not_write(store):
    store.write_sync(new_job)
    store.buffer_samples(
        TelemetrySample, [dict(job_id="j1", device="n/0", time=time.time(), step=3, compute_s_per_block=0.1)]
    )

    def set_step_then_fail(session):
        queries.get_job(session, "j1").step = 3
        raise RuntimeError("disk full")

    with pytest.raises(RuntimeError):
        asyncio.run(store.flush_samples(also=set_step_then_fail))
    assert store.read(lambda s: queries.telemetry(s, "j1", "n/0")) == []
    assert store.read(lambda s: queries.get_job(s, "j1")).step != 3
    assert asyncio.run(store.flush_samples()) == 1  # still buffered, written by the next flush
    assert [t.step for t in store.read(lambda s: queries.telemetry(s, "j1", "n/0"))] == [3]


def test_concurrent_writers_serialized(store):
    store.write_sync(new_job)

    async def run():
        await asyncio.gather(
            *(store.write(lambda s, i=i: queries.add_event(s, "j1", i, "tick", {})) for i in range(50))
        )

    asyncio.run(run())
    assert len(store.read(lambda s: queries.events(s, "j1"))) == 50


def test_history_survives_reopen(database_url):
    first = Store(database_url)
    first.write_sync(new_job)
    first.write_sync(lambda s: queries.add_plan(s, "j1", {"pipelines": []}, "initial"))
    first.close()
    second = Store(database_url)
    assert second.write_sync(lambda s: queries.add_plan(s, "j1", {}, "next").version) == 2
    second.close()


def test_a_node_is_what_its_agent_last_said(store):
    gpu = {"kind": "cuda", "name": "A100", "memory_gib": 80.0, "tflops": 312.0}
    store.write_sync(
        lambda s: queries.upsert_node(
            s,
            "n",
            [{"id": "n/0", **gpu}, {"id": "n/1", **gpu}],
            [{"name": "ib0", "type": "ib", "gbps": 200.0}],
            "0.1.0",
        )
    )
    store.write_sync(lambda s: queries.upsert_node(s, "n", [{"id": "n/0", **gpu, "memory_gib": 40.0}], [], "0.1.1"))
    devices = store.read(lambda s: queries.devices_of(s, "n"))
    assert [(d.id, d.memory_gib) for d in devices] == [("n/0", 40.0)]
    assert store.read(lambda s: queries.nics_of(s, "n")) == []
    assert store.read(lambda s: queries.get_node(s, "n")).agent_version == "0.1.1"


def test_a_database_that_went_missing_is_not_silently_recreated(tmp_path):
    db = tmp_path / "drover.db"
    Store(sqlite_url(str(db))).close()
    db.unlink()
    with pytest.raises(StoreError, match="missing.*--new-db"):
        Store(sqlite_url(str(db)))
    Store(sqlite_url(str(db)), create=True).close()  # told to start empty


@pytest.mark.parametrize("content", [b"not a database at all " * 100, b"SQLite format 3\x00" + b"\x00" * 200])
def test_a_corrupt_database_is_refused_with_what_to_do(tmp_path, content):
    db = tmp_path / "drover.db"
    db.write_bytes(content)
    with pytest.raises(StoreError, match="restore it from a backup"):
        Store(sqlite_url(str(db)))
    Store(sqlite_url(str(tmp_path / "other.db"))).close()  # and the lock was let go: no leak


def test_a_second_store_on_one_database_is_refused(database_url):
    first = Store(database_url)
    with pytest.raises(StoreInUse):
        Store(database_url)
    first.close()
    Store(database_url).close()


def test_a_nics_measured_bandwidth_is_the_median_of_its_links_and_outlives_a_reconnect(store):
    ib = [{"name": "ib", "type": "infiniband", "gbps": 200.0}]
    for node in ("a", "b", "c"):
        store.write_sync(lambda s, n=node: queries.upsert_node(s, n, [], ib, "t", probe_port=7000))
    samples = [
        {"nic": "ib", "peer": "b", "gbps": 50.0, "time": 1.0},
        {"nic": "ib", "peer": "c", "gbps": 190.0, "time": 1.0},
    ]
    changed = store.write_sync(lambda s: queries.record_links(s, "a", samples))
    # a's links: 50 and 190 (median 120); b's and c's: their one link each, probed from a.
    assert changed == {("a", "ib"): (0.0, 120.0), ("b", "ib"): (0.0, 50.0), ("c", "ib"): (0.0, 190.0)}
    again = [{"nic": "ib", "peer": "b", "gbps": 60.0, "time": 2.0}]  # newer probe of the same link replaces it
    store.write_sync(lambda s: queries.record_links(s, "a", again))
    store.write_sync(lambda s: queries.upsert_node(s, "b", [], ib, "t", probe_port=7001))  # b reconnects
    measured = {n: store.read(lambda s, n=n: queries.nics_of(s, n))[0].measured_gbps for n in ("a", "b", "c")}
    assert measured == {"a": 125.0, "b": 60.0, "c": 190.0}
    assert [(k.peer, k.gbps) for k in store.read(lambda s: queries.links_of(s, "a"))] == [("b", 60.0), ("c", 190.0)]
    assert store.read(lambda s: queries.get_node(s, "b")).probe_port == 7001


def test_a_nics_measure_is_its_newest_round_of_probes(store):
    # After a's link slowed, b's stale probe of it (0.2) and a's fresh one (0.006) read 0.1.
    ib = [{"name": "ib", "type": "infiniband", "gbps": 0.2}]
    for node in ("a", "b"):
        store.write_sync(lambda s, n=node: queries.upsert_node(s, n, [], ib, "t", probe_port=7000))
    store.write_sync(lambda s: queries.record_links(s, "b", [{"nic": "ib", "peer": "a", "gbps": 0.2, "time": 0.0}]))
    fresh = [{"nic": "ib", "peer": "b", "gbps": 0.006, "time": 100.0}]
    changed = store.write_sync(lambda s: queries.record_links(s, "a", fresh))
    assert changed[("a", "ib")] == (0.2, 0.006) and changed[("b", "ib")] == (0.2, 0.006)


def test_a_database_from_before_migrations_is_upgraded_and_keeps_its_rows(tmp_path):
    """As the last release without migrations made it (no alembic_version, job_history or settings), and
    older still: without columns that release had added."""
    path = tmp_path / "old.db"
    Store(sqlite_url(str(path)), create=True).write_sync(
        lambda s: queries.upsert_node(s, "n", [], [{"name": "ib", "type": "infiniband", "gbps": 200.0}], "old")
    )
    with sqlite3.connect(path) as old:
        old.execute("DROP TABLE alembic_version")
        old.execute("DROP TABLE job_history")
        old.execute("DROP TABLE settings")
        for table, column in [("nodes", "probe_port"), ("nics", "address"), ("nics", "measured_gbps")]:
            old.execute(f"ALTER TABLE {table} DROP COLUMN {column}")
    store = Store(sqlite_url(str(path)))
    (nic,) = store.read(lambda s: queries.nics_of(s, "n"))
    assert (nic.gbps, nic.address, nic.measured_gbps) == (200.0, "", 0.0)
    assert store.read(lambda s: queries.get_node(s, "n")).probe_port == 0
    with sqlite3.connect(path) as upgraded:
        assert upgraded.execute("SELECT version_num FROM alembic_version").fetchall() == [("0003",)]
        assert upgraded.execute("SELECT count(*) FROM job_history").fetchone() == (0,)


def test_the_migrations_make_exactly_the_schema_of_the_models(database_url):
    Store(database_url).close()
    engine = create_engine(database_url)
    with engine.connect() as connection:
        assert compare_metadata(MigrationContext.configure(connection), Base.metadata) == []
        assert connection.exec_driver_sql("SELECT version_num FROM alembic_version").scalar() == "0003"
        if engine.dialect.name == "postgresql":  # ids count past 2^31 (8,000 samples a second: 3 days)
            kinds = connection.exec_driver_sql("SELECT sequence_name, data_type FROM information_schema.sequences")
            assert dict(kinds.fetchall()) == {
                f"{t}_id_seq": "bigint" for t in ("telemetry", "nic_samples", "events", "job_history")
            }
    engine.dispose()


def test_a_database_of_the_previous_release_is_upgraded_and_keeps_its_rows(database_url):
    engine = create_engine(database_url)
    migrate(engine, "0001")  # the schema the previous release made
    with engine.begin() as c:
        c.exec_driver_sql(
            "INSERT INTO jobs (id, state, model_yaml, model_name, steps, seed, out_dir, step, plan_version, "
            "committed_plan_version, detail, created, ranks_json, master_addr, master_port) VALUES "
            "('j1', 'completed', '{}', 'tiny', 30, 7, 'out', 29, 2, 2, '', 1.0, '{}', '127.0.0.1', 0)"
        )
        c.exec_driver_sql(
            "INSERT INTO events (job_id, time, step, kind, details_json) VALUES ('j1', 1.0, 3, 'job_started', '{}')"
        )
    engine.dispose()
    store = Store(database_url)
    job = store.read(lambda s: queries.get_job(s, "j1"))
    assert (job.steps, job.seed, job.step, job.plan_version) == (30, 7, 29, 2)
    assert [e.kind for e in store.read(lambda s: queries.events(s, "j1"))] == ["job_started"]
    huge = (1 << 63) - 1  # 64-bit now, PostgreSQL included
    store.write_sync(lambda s: setattr(queries.get_job(s, "j1"), "seed", huge))
    assert store.read(lambda s: queries.get_job(s, "j1")).seed == huge
    assert store.read(lambda s: queries.history(s, "j1")) == []  # the new tables are there
    assert store.read(lambda s: queries.setting(s, "detection_paused", "unset")) == "unset"
    store.write_sync(lambda s: queries.set_setting(s, "detection_paused", True))
    store.write_sync(lambda s: queries.set_setting(s, "detection_paused", False))  # replaces it
    assert store.read(lambda s: queries.setting(s, "detection_paused", "unset")) is False
    store.close()
