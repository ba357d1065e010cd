"""Link probes over real TCP on loopback: measured, bounded, and a failure reads 0."""

from __future__ import annotations

import asyncio
import struct

from drover.agent import probe


async def test_a_probe_measures_the_link_and_the_responder_is_bounded():
    server, port = await probe.serve()
    try:
        assert await probe.probe("127.0.0.1", port, 4 << 20, "127.0.0.1") > 0.01  # Gbps, loopback
        # A sender that claims more than MAX_PROBE_BYTES is cut off without an answer.
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        writer.write(struct.pack("!Q", probe.MAX_PROBE_BYTES + 1))
        await writer.drain()
        assert await reader.read() == b""
        writer.close()
    finally:
        server.close()
        await server.wait_closed()
    assert await probe.probe("127.0.0.1", port, 1 << 10) == 0.0  # nobody answers now
