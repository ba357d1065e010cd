"""free_port: a port to hand a server or a rendezvous that binds it a moment later."""

from __future__ import annotations

import socket

from drover.planner import ports


def test_a_free_port_lies_below_the_range_of_outgoing_connections_and_binds():
    low = ports._ephemeral_low()
    for _ in range(20):
        port = ports.free_port()
        assert 1024 <= port < low  # where no outgoing connection takes it before its server binds
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))


def test_with_no_room_below_the_range_it_takes_the_kernels_choice(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: 1024)
    port = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
