"""A free TCP port on this machine, for a server or a rendezvous about to bind it."""

from __future__ import annotations

import socket


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_port_range(count: int, attempts: int = 50) -> int:
    """The first of `count` consecutive free TCP ports (e.g. drover up --metrics-port)."""
    for _ in range(attempts):
        base = free_port()
        if base + count > 65536:
            continue
        sockets = []
        try:
            for port in range(base, base + count):
                s = socket.socket()
                sockets.append(s)
                s.bind(("127.0.0.1", port))
            return base
        except OSError:
            continue
        finally:
            for s in sockets:
                s.close()
    raise RuntimeError(f"no {count} consecutive free ports found in {attempts} attempts")
