"""Workers' logs on this node, and sending them up the agent stream.

Each worker's stdout and stderr go to WORK_DIR/NODE/JOB/logs/DEVICE.log (the
worker redirects its file descriptors at start, so a traceback, a print in a
user's model and torch's own warnings all land there). `drover job logs`
asks the control plane, which sends ReadLogs to the agents that ran the job;
each request is a task here that sends the tail of each log in chunks and,
when following, what is written next, until the job ends on this node or
StopLogs comes.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from pathlib import Path

from drover.v1 import agent_pb2

from .runtime.handoff import inside

CHUNK_BYTES = 64 * 1024
MAX_TAIL_BYTES = 16 * 1024 * 1024
DEFAULT_TAIL_BYTES = 1024 * 1024
MAX_READERS = 8  # log requests served at once; more are refused with a note
MAX_WINDOW = 256  # data chunks in flight a request, before acknowledgements
FOLLOW_EVERY_S = 0.5
JOB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")


def log_file(job_folder: Path, device: str) -> Path:
    """JOB_FOLDER/logs/DEVICE.log, '_' for '/' (node-1/0 -> node-1_0.log)."""
    return job_folder / "logs" / f"{device.replace('/', '_')}.log"


def device_of(path: Path) -> str:
    node, _, index = path.stem.rpartition("_")
    return f"{node}/{index}"


class Credit:
    """How many more data chunks a request may send: `window` at first, more as the control
    plane acknowledges what its reader took (AckLogs), never more than `window` outstanding."""

    def __init__(self, window: int):
        # 0: a control plane that does not acknowledge (older than flow control): no limit.
        self.window = min(window, MAX_WINDOW) if window else 1 << 62
        self.left = self.window
        self.changed = asyncio.Event()

    async def take(self) -> None:
        while self.left <= 0:
            self.changed.clear()
            await self.changed.wait()
        self.left -= 1

    def give(self, chunks: int) -> None:
        self.left = min(self.left + chunks, self.window)
        self.changed.set()


async def send_logs(
    work_dir: Path,
    node: str,
    request: agent_pb2.ReadLogs,
    send: Callable[[agent_pb2.AgentMessage], None],
    running: Callable[[], bool],
    credit: Credit | None = None,
) -> None:
    """Serve one ReadLogs: chunks through `send`, the last with end set; `running()` says whether
    the job still runs here (following stops once it does not, after a last read). Each data
    chunk waits for `credit` (default: the request's window, never acknowledged)."""
    credit = credit or Credit(request.window)

    def chunk(**fields) -> None:
        send(agent_pb2.AgentMessage(log_chunk=agent_pb2.LogChunk(request_id=request.request_id, **fields)))

    if not JOB_ID.fullmatch(request.job_id):
        chunk(end=True, note=f"job id {request.job_id[:80]!r}: not a job id")
        return
    try:
        folder = inside(work_dir, request.job_id) / "logs"
    except ValueError as exc:
        chunk(end=True, note=str(exc))
        return
    wanted = {d for d in request.devices if d.startswith(node + "/")}
    files = sorted(p for p in folder.glob("*.log") if not wanted or device_of(p) in wanted) if folder.is_dir() else []
    if not files:
        chunk(end=True, note=f"no worker logs of {request.job_id} on {node}")
        return
    tail = min(request.tail_bytes or DEFAULT_TAIL_BYTES, MAX_TAIL_BYTES)
    offsets = {}
    try:
        for path in files:
            size = path.stat().st_size
            offsets[path] = await _send_from(path, max(0, size - tail), size, chunk, credit)
        while request.follow:
            still = running()  # read before the last pass, so output written before the end is sent
            await asyncio.sleep(FOLLOW_EVERY_S)
            for path in sorted(folder.glob("*.log")):
                if not wanted or device_of(path) in wanted:
                    size = path.stat().st_size
                    offsets[path] = await _send_from(path, offsets.get(path, 0), size, chunk, credit)
            if not still:
                break
    except OSError as exc:  # a log gone or unreadable: the request ends saying so
        chunk(end=True, note=f"reading the logs of {request.job_id} on {node}: {exc}"[:1000])
        return
    chunk(end=True)


async def _send_from(path: Path, start: int, end: int, chunk, credit: Credit) -> int:
    """Send bytes [start, end) of the file, a chunk per credit; the offset reached."""
    with open(path, "rb") as f:
        f.seek(start)
        while start < end:
            data = f.read(min(CHUNK_BYTES, end - start))
            if not data:
                break
            await credit.take()
            chunk(device=device_of(path), data=data)
            start += len(data)
    return start
