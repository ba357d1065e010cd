"""Link probes: how fast this node really reaches another on each network.

Every agent answers probes on one TCP port (`serve`): a probe sends an 8-byte
length and that many bytes, and gets two bytes back once all have arrived.
On the control plane's command (ProbeLinks) an agent probes its targets one
after another (`probe`), from the interface of each network, and reports the
measured Gbps with the job's telemetry. The planner then plans with measured
bandwidths rather than the NICs' nominal speeds.
"""

from __future__ import annotations

import asyncio
import struct
import time

MAX_PROBE_BYTES = 64 << 20  # a probe is bounded: an agent reads at most this much per connection
CHUNK = 256 << 10
TIMEOUT_S = 30.0


_ANSWERING = asyncio.Semaphore(4)  # probes answered at once; more are turned away


async def serve(port: int = 0) -> tuple[asyncio.AbstractServer, int]:
    """The probe responder, on every IPv4 interface (the addresses agents report), at `port`
    (0: any free one); (server, its port). One socket: on every address family at port 0, each
    would get a port of its own."""
    server = await asyncio.start_server(_answer, host="0.0.0.0", port=port)
    return server, server.sockets[0].getsockname()[1]


async def _answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    if _ANSWERING.locked():
        writer.close()
        return
    async with _ANSWERING:
        await _read_probe(reader, writer)


async def _read_probe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        async with asyncio.timeout(TIMEOUT_S):
            (size,) = struct.unpack("!Q", await reader.readexactly(8))
            if size > MAX_PROBE_BYTES:
                return
            left = size
            while left:
                chunk = await reader.read(min(left, CHUNK))
                if not chunk:
                    return
                left -= len(chunk)
            writer.write(b"ok")
            await writer.drain()
    except (TimeoutError, OSError, asyncio.IncompleteReadError):
        pass
    finally:
        writer.close()


async def probe(address: str, port: int, size: int, source: str = "") -> float:
    """Gbps from here (bound to `source`, this end's address on the network) to a peer's probe
    port; 0.0 when the probe fails. A link too slow to carry `size` within the time limit is
    measured by what got through."""
    size = max(1, min(size, MAX_PROBE_BYTES))
    payload = bytes(min(size, CHUNK))
    sent, started = 0, time.perf_counter()
    try:
        async with asyncio.timeout(TIMEOUT_S):
            local = (source, 0) if source else None
            reader, writer = await asyncio.open_connection(address, port, local_addr=local)
            try:
                started = time.perf_counter()
                writer.write(struct.pack("!Q", size))
                while sent < size:
                    writer.write(payload[: min(size - sent, CHUNK)])
                    await writer.drain()
                    sent += min(size - sent, CHUNK)
                if await reader.readexactly(2) != b"ok":
                    return 0.0
            finally:
                writer.close()
    except TimeoutError:
        return sent * 8 / (time.perf_counter() - started) / 1e9 if sent >= CHUNK else 0.0
    except (OSError, asyncio.IncompleteReadError):
        return 0.0
    return size * 8 / (time.perf_counter() - started) / 1e9
