"""A throwaway PostgreSQL server on this machine, from Debian's binaries (the `postgresql`
package): for the tests and benchmarks that run the store against PostgreSQL, and for trying
`drover server --db postgresql+psycopg://...` on one machine. Not how to run production."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalPostgres:
    """initdb in `root`, the server on a free loopback port trusting local connections (as
    the `postgres` user when we are root: initdb refuses root); `database()` makes a fresh
    database and returns its URL; `stop()` ends the server."""

    def __init__(self, root: Path):
        binaries = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
        if not binaries:
            raise RuntimeError("no PostgreSQL binaries under /usr/lib/postgresql (apt-get install postgresql)")
        self.bin, self.root, self.port, self.count = binaries[-1].parent, Path(root), _free_port(), 0
        self.root.mkdir(parents=True, exist_ok=True)
        self.as_user = ["runuser", "-u", "postgres", "--"] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.root, "postgres")
        data = self.root / "data"
        self._run("initdb", "-D", str(data), "--auth=trust", "--username=postgres", "--encoding=UTF8")
        options = f"-p {self.port} -k {self.root} -c listen_addresses=127.0.0.1 -c max_connections=300"
        self._run("pg_ctl", "-D", str(data), "-o", options, "-l", str(self.root / "server.log"), "-w", "start")

    def _run(self, program: str, *args: str) -> None:
        subprocess.run([*self.as_user, str(self.bin / program), *args], check=True, capture_output=True, timeout=120)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{database}"

    def database(self) -> str:
        """A new empty database's URL."""
        import psycopg

        self.count += 1
        name = f"drover_{os.getpid()}_{self.count}"
        with psycopg.connect(f"host=127.0.0.1 port={self.port} user=postgres dbname=postgres", autocommit=True) as c:
            c.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def stop(self) -> None:
        self._run("pg_ctl", "-D", str(self.root / "data"), "-m", "fast", "stop")
        shutil.rmtree(self.root, ignore_errors=True)
