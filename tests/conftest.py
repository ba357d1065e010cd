"""Shared fixtures: where the spec's golden examples are, the factories of
test clusters and models (named variants, see support.py) and of control
planes served in process."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest
import pytest_asyncio

from drover.storage.db import sqlite_url
from drover.storage.local_postgres import LocalPostgres

from support import ROOT, make_cluster, make_model, serve_plane

SPEC_EXAMPLES = Path(os.environ.get("DROVER_SPEC_EXAMPLES", ROOT.parent / "shared" / "spec" / "examples"))


@pytest.fixture
def spec_examples() -> Path:
    if not SPEC_EXAMPLES.is_dir():
        pytest.skip(f"spec examples not found at {SPEC_EXAMPLES} (set DROVER_SPEC_EXAMPLES)")
    return SPEC_EXAMPLES


@pytest.fixture
def cluster_factory():
    return make_cluster


@pytest.fixture
def model_factory():
    return make_model


@pytest_asyncio.fixture
async def plane_factory(tmp_path):
    """Control planes in process (real port, real SQLite file), one per call with its
    options as the named variant: `await plane_factory(device_silence_s=1.0)`."""
    stops = []

    async def make(**options):
        served, stop = await serve_plane(tmp_path, **options)
        stops.append(stop)
        return served

    yield make
    for stop in stops:
        await stop()


@pytest_asyncio.fixture
async def plane(plane_factory):
    """The default variant of plane_factory; see support.Plane."""
    return await plane_factory()


@pytest.fixture
def network_namespaces():
    """For a test that makes network namespaces or asserts there are none: one such test at a
    time on this machine (make test runs the suite in several processes)."""
    with open(Path(tempfile.gettempdir()) / "drover-test-network-namespaces.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


@pytest.fixture(scope="session")
def chromium() -> str:
    """A headless browser for the report's test, installed by the project's own set-up."""
    subprocess.run([str(ROOT / "scripts" / "ensure_packages.sh"), "chromium=chromium"], check=True, timeout=600)
    return shutil.which("chromium")


@pytest.fixture(scope="session")
def postgres():
    """The session's PostgreSQL server (drover.storage.local_postgres), installed by the
    project's own set-up when missing and started on first use."""
    subprocess.run([str(ROOT / "scripts" / "ensure_packages.sh"), "pg_ctlcluster=postgresql"], check=True, timeout=600)
    server = LocalPostgres(Path(tempfile.mkdtemp(prefix="drover-pg-")))
    yield server
    server.stop()


@pytest.fixture(params=["sqlite", "postgresql"])
def database_url(request, tmp_path) -> str:
    """A fresh database's URL: a SQLite file, and a PostgreSQL database."""
    if request.param == "sqlite":
        return sqlite_url(str(tmp_path / "drover.db"))
    return request.getfixturevalue("postgres").database()
