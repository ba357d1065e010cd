"""TCP addresses: HOST:PORT parsed, and a free port on this machine for a server or a
rendezvous about to bind it."""

from __future__ import annotations

import random
import socket
from pathlib import Path


def _ephemeral_low() -> int:
    """Where the kernel starts picking the local ports of outgoing connections (Linux's
    ip_local_port_range; 32768 by default)."""
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port() -> int:
    """A port free now, that whoever asked binds soon after. Drawn below the ephemeral range:
    there, any outgoing connection (a gRPC channel, gloo's) could take it in the meantime, which
    a machine running many jobs (or tests) at once saw happen."""
    low = _ephemeral_low()
    below = range(max(1024, low - 12000), low)
    for port in random.sample(below, min(20, len(below))):
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
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


def host_port(address: str) -> tuple[str, int]:
    """HOST:PORT (or [V6]:PORT) as (host, port); ValueError if it is none (a port past 65535
    would wrap around where gRPC reads it)."""
    host, _, port = address.rpartition(":")
    if not host or not port.isascii() or not port.isdigit() or not 0 <= int(port) < 65536:
        raise ValueError(f"{address[:80]!r}: expected HOST:PORT with a port from 0 to 65535, e.g. 127.0.0.1:50051")
    return host.strip("[]"), int(port)
