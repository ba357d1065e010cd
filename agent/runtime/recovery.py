"""Surviving lost peers: when a collective fails because a peer is gone, the
surviving workers keep their model and optimizer state in memory, leave the
broken process groups, wait for a new world (a rendezvous, ranks and a plan
for the survivors, dropped into their inbox as `world-G.json` by whoever
coordinates: the agent, from the control plane), and join it.

The step commit protocol (docs/architecture.md) makes every survivor hold
the same last completed step afterwards:

- a step's gradients are summed and clipped, then a world-wide all-reduce
  of the loss is the *vote*; only a worker whose vote completed applies the
  update, so the update is the commit;
- if any worker completed the vote of step k, every worker reached it, so
  every survivor holds step k's final gradients: in the new world the
  survivors agree on the newest committed step (all-reduce MAX) and those
  whose vote failed apply step k's update then (roll forward);
- if none completed it, step k is redone under the new plan.

Parts whose every copy was lost are rolled back from the newest checkpoint,
by every worker, to the same step.

A survivor can be blocked on a peer that is alive but gone from the world (in
the middle of leaving it, or waiting for the next) rather than dead: no error
reaches it until the collective times out. A worker leaving a world shuts its
connections (close_connections), and each survivor's WorldWatch closes the lost
world's connections once the inbox names a world without some member of it.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import queue
import re
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from drover.planner.plan import Plan, plan_from_dict

log = logging.getLogger("drover.worker")

# How torch.distributed says a peer is gone: gloo's transport errors (a peer's socket closed
# or reset, a read or write on it failing, a collective timing out), NCCL's aborts.
_PEER_LOST = re.compile(
    r"Connection (closed|reset) by peer|Read error|Write error|Broken pipe|Timed out|timed out|"
    r"NCCL communicator was aborted|ProcessGroupNCCL.*(error|abort)|Socket Timeout|connect(ion)? refused|"
    r"Connection was likely closed",  # the rendezvous store's, when its host is gone
    re.IGNORECASE,
)
# Every collective, in the world's group and in the groups made from it (new_group would take
# torch's 30 minutes): past it a peer that never answers counts as lost.
COLLECTIVE_TIMEOUT_S = 300
WAIT_POLL_S = 0.05  # how late WorldWatch.wait may notice its world is over
WORLD_FILE = re.compile(r"world-(\d+)\.json")
ABANDONED: list = []  # (collective, group) left behind by WorldWatch.wait: never destroyed


def peer_lost(exc: BaseException) -> bool:
    """Whether a failed collective means a lost peer (as opposed to a bug to report)."""
    return isinstance(exc, RuntimeError) and bool(_PEER_LOST.search(str(exc)))


@dataclass(frozen=True)
class World:
    generation: int
    init_method: str
    ranks: dict[str, int]  # device id -> rank in the new world
    plan_version: int
    plan: Plan

    @property
    def size(self) -> int:
        return len(self.ranks)

    def to_dict(self) -> dict:
        return {
            "generation": self.generation,
            "init_method": self.init_method,
            "ranks": self.ranks,
            "plan_version": self.plan_version,
            "plan": self.plan.to_dict(),
        }


def world_from_dict(data: dict, source: str) -> World:
    ranks = {str(d): int(r) for d, r in data["ranks"].items()}
    if sorted(ranks.values()) != list(range(len(ranks))):
        raise ValueError(f"{source}: ranks {sorted(ranks.values())} are not 0..{len(ranks) - 1}")
    return World(
        int(data["generation"]),
        str(data["init_method"]),
        ranks,
        int(data["plan_version"]),
        plan_from_dict(data["plan"], f"{source}: plan"),
    )


def worlds_after(inbox: Path, after: int) -> list[tuple[int, Path]]:
    """The world files of generations above `after`, oldest first (agents write them atomically)."""
    found = []
    for path in inbox.glob("world-*.json"):
        match = WORLD_FILE.fullmatch(path.name)
        if match and int(match.group(1)) > after:
            found.append((int(match.group(1)), path))
    return sorted(found)


def newest_world(inbox: Path, after: int) -> World | None:
    """The newest world of a generation above `after`, if any."""
    found = worlds_after(inbox, after)
    if not found:
        return None
    _, path = found[-1]
    return world_from_dict(json.loads(path.read_text()), str(path))


def rendezvous_store(init_method: str, rank: int, size: int, timeout_s: float):
    """A world's rendezvous store at tcp://HOST:PORT. Rank 0 serves it; the others first wait
    for it to listen, polling every 10 ms: c10d's own client backs off for up to a second when
    it comes early, and after a loss every survivor comes early. Every world of a job is made
    this way (the first too): init_process_group prefixes the keys of a store it makes itself
    but not of one it is given, so all members of a world must come the same way."""
    import torch.distributed as dist

    host, port = init_method.removeprefix("tcp://").rsplit(":", 1)
    host = host.strip("[]")  # an IPv6 address
    if rank != 0:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"timed out: no rendezvous at {host}:{port}") from None
                time.sleep(0.01)
    timeout = datetime.timedelta(seconds=timeout_s)
    return dist.TCPStore(host, int(port), size, rank == 0, timeout=timeout, wait_for_workers=False)


def wait_for_world(inbox: Path, after: int, timeout_s: float, poll_s: float = 0.05) -> World:
    deadline = time.monotonic() + timeout_s
    while True:
        world = newest_world(inbox, after)
        if world is not None:
            return world
        if time.monotonic() > deadline:
            raise TimeoutError(f"no new world in {inbox} within {timeout_s:.0f} s after losing a peer")
        time.sleep(poll_s)


def close_connections() -> list[str]:
    """Shut down every connected TCP socket of this process (Linux): a lost world's gloo pairs
    and store client, the only ones a worker holds. What is blocked on them fails at once with
    a closed connection (peer_lost). Listening sockets stay: gloo's listener aborts the process
    if its socket is shut. Returns the peers (host:port) of those shut, for the log. (A socket
    object over a duplicate shares the original's flags; no default socket timeout is set in a
    worker, so wrapping changes none.)"""
    try:
        fds = os.listdir("/proc/self/fd")
    except OSError:
        return []
    closed = []
    for fd in fds:
        try:
            if not os.readlink(f"/proc/self/fd/{fd}").startswith("socket:"):
                continue
            dup = os.dup(int(fd))
        except OSError:  # closed since
            continue
        try:
            sock = socket.socket(fileno=dup)  # closes the duplicate when done with
        except OSError:
            os.close(dup)
            continue
        with sock:
            try:
                if sock.family in (socket.AF_INET, socket.AF_INET6) and sock.type == socket.SOCK_STREAM:
                    peer = sock.getpeername()  # raises for a listening socket
                    sock.shutdown(socket.SHUT_RDWR)
                    closed.append(f"{peer[0]}:{peer[1]}")
            except OSError:
                pass
    return closed


def world_ending(inbox: Path, generation: int, devices: frozenset[str]) -> tuple[int, list[str]] | None:
    """The first world after `generation` named in the inbox that leaves out some of `devices`
    (the members of the world `generation`), and those it leaves out; None if every later world
    keeps them all (the job grew, or nothing came)."""
    for number, path in worlds_after(inbox, generation):
        gone = sorted(devices - json.loads(path.read_text())["ranks"].keys())
        if gone:
            return number, gone
    return None


def _waiter() -> queue.SimpleQueue:
    """A thread that waits for each work put to it, in turn, and says when it is done (and how
    it failed): WorldWatch.wait's. None ends it, once the work it waits for ends."""
    works: queue.SimpleQueue = queue.SimpleQueue()

    def run() -> None:
        while (item := works.get()) is not None:
            work, done, failed = item
            try:
                work.wait()
            except Exception as exc:  # noqa: BLE001 - raised in the worker's thread instead
                failed.append(exc)
            done.set()
            # Nothing of it kept while waiting for the next: the worker's frames, which a raised
            # error's traceback holds, would keep a lost world's groups and sockets alive.
            del work, done, failed, item

    threading.Thread(target=run, name="work-waiter", daemon=True).start()
    return works


class WorldWatch:
    """Frees a worker stuck in a world that has lost a member. While the worker is in a world
    (enter), a thread polls the inbox; once it names a later world without some member of this
    one, this one is over (a world that grows keeps them all), and its connections are closed
    (close_connections), so that a collective or store read waiting on a peer that left it
    fails now instead of at COLLECTIVE_TIMEOUT_S. It fires once per world entered. The worker
    leaves the watch when it leaves a world, and enters the next one before it makes that
    world's connections; the lock makes a firing finish before either, so it never closes the
    next world's connections."""

    def __init__(self, inbox: Path | None, poll_s: float = 0.25):
        """inbox None: watch nothing (a worker without an agent; NCCL, whose sockets are its
        own business: its collective timeout applies)."""
        self._lock = threading.Lock()
        self._world: tuple[int, frozenset[str]] | None = None
        self.ended = threading.Event()  # the world entered last is over (set by a firing)
        self.watching = inbox is not None
        if inbox is not None:
            self._waiter = _waiter()
            threading.Thread(target=self._run, args=(inbox, poll_s), name="world-watch", daemon=True).start()

    def enter(self, generation: int, devices) -> None:
        with self._lock:
            self._world = (generation, frozenset(devices))
            self.ended.clear()

    def wait(self, work, group=None) -> None:
        """Wait for a collective or point-to-point `work` (async_op) of the world entered, unless
        that world is found over first: then raise a lost peer, leaving the work behind. Shutting
        the world's sockets (the firing) frees what waits on them (a send to a silent peer too,
        in a test), but a kill run once saw a wait end only at COLLECTIVE_TIMEOUT_S (an
        intermittent 5-minute stall, not reproduced since): this frees the worker whatever gloo
        does with its sockets. The waiting is a thread's (gloo completes
        a send or receive only inside its wait, so polling cannot tell when it is done), which a
        given-up work keeps; the next wait gets a new one. An abandoned work and its group are
        kept for the process's life: destroying a group whose work is pending blocks until that
        ends."""
        if not self.watching:
            work.wait()
            return
        done, failed = threading.Event(), []
        self._waiter.put((work, done, failed))
        while not done.wait(WAIT_POLL_S):
            if self.ended.is_set() and not done.is_set():
                ABANDONED.append((work, group))
                self._waiter.put(None)  # its thread ends if the work ever does
                self._waiter = _waiter()
                raise RuntimeError("Connection closed by peer: the world ended while a collective waited (world watch)")
        if failed:
            raise failed.pop()  # held nowhere else once raised (see _waiter)

    def leave(self) -> None:
        with self._lock:
            self._world = None

    def _run(self, inbox: Path, poll_s: float) -> None:
        failed = ""  # the last error logged: once, not every poll
        while True:
            time.sleep(poll_s)
            with self._lock:
                if self._world is None:
                    continue
                generation, devices = self._world
                try:
                    ending = world_ending(inbox, generation, devices)
                    if ending is not None:
                        closed = close_connections()
                        log.warning(
                            "world %d leaves out %s: closed world %d's %d connections (to %s)",
                            ending[0],
                            ending[1][:8],
                            generation,
                            len(closed),
                            ", ".join(closed[:16]),
                        )
                        self._world = None
                        self.ended.set()
                except Exception as exc:  # noqa: BLE001 - the watch must outlive a bad world file; the worker reports it
                    if str(exc) != failed:
                        failed = str(exc)
                        log.exception("watching %s for the end of world %d", inbox, generation)
