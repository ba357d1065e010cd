"""What an agent hands its workers, and how it starts them, without importing torch.

The agent is a long-lived asyncio process that starts, feeds and watches workers; it
never needs torch itself (seconds to import, hundreds of MB). The worker launcher, a
forkserver, imports torch once, and every process that runs torch or the user's model
code is forked from it: the workers, and the check of a job's inputs before they start.
"""

from __future__ import annotations

import json
import multiprocessing
import os
import select
import signal
import threading
import time
from dataclasses import dataclass, replace
from multiprocessing import forkserver
from pathlib import Path

from drover.planner.model import ModelSpec
from drover.planner.plan import Plan
from drover.planner.training import Training

FORKED_TIMEOUT_S = 300.0  # a job's inputs checked (a checkpoint's index, shard headers, the user's model built)


def worker_context():
    """Workers fork from a server that has imported torch once: starting one is then
    a fork, not an interpreter and a torch import per worker."""
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["drover.agent.runtime.worker", "drover.agent.runtime.preload"])
    return ctx


def start_worker_launcher() -> None:
    """Start the forkserver now. Workers take its CPU priority, so a daemon that starts it
    before lowering its own keeps its workers at full priority."""
    worker_context()
    forkserver.ensure_running()


def pace(tflops: float, spec: ModelSpec) -> float:
    """The FLOP/s a paced device emulates at full health: its GPU's tflops x the model's mfu."""
    return tflops * 1e12 * spec.mfu


def inside(root: Path, relative: str) -> Path:
    """`root / relative`, resolved (symlinks followed), refused unless it stays inside `root`:
    names from the network never reach outside the agent's folders."""
    root = root.resolve()
    path = (root / relative).resolve()
    if Path(relative).is_absolute() or not path.is_relative_to(root):
        # Not naming the root: the job's failure says why to readers, who need not see the agent's paths.
        raise ValueError(f"{relative[:80]!r} leads outside the agent's folder for it")
    return path


MAX_CHECKED_ENTRIES = 100_000  # a folder a job writes, walked for links: past this, refused


def no_links_out(root: Path, folder: Path) -> None:
    """Refuse a folder a job writes (its output, its checkpoints) if anything in it is a symbolic
    link leading outside `root`: the workers' files would follow it (a `model.pt` linked to a
    file elsewhere is overwritten). `inside` checks the folder's own path; this, what is in it,
    as the job starts, through links to folders inside the root too (each folder once). Links
    that stay inside the root are the user's business."""
    if not folder.is_dir():
        return
    root = root.resolve()
    todo, seen, entries = [folder], set(), 0
    while todo:
        here = todo.pop()
        real = here.resolve()
        if real in seen:
            continue
        seen.add(real)
        for path in here.iterdir():
            entries += 1
            if entries > MAX_CHECKED_ENTRIES:
                raise ValueError(f"{folder.name!r} holds over {MAX_CHECKED_ENTRIES:,} entries: give the job another")
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                shown = path.relative_to(root) if path.is_relative_to(root) else path.name
                raise ValueError(f"{str(shown)[:200]!r} links outside the data root: the job would write there")
            if path.is_dir():  # a folder, or a link to one inside the root: what is in it too
                todo.append(path)


def new_lines(path: Path, offset: int) -> tuple[list[dict], int]:
    """The complete JSON lines a worker appended to `path` after byte `offset`, and the offset
    after them (a line still being written waits for the next call)."""
    try:
        with path.open("rb") as f:
            f.seek(offset)
            data = f.read()
    except OSError:
        return [], offset
    complete = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()], offset + len(complete)


def telemetry_file(out: Path, device: str, suffix: str) -> Path:
    """OUT/telemetry/DEVICE.SUFFIX, the device id with '_' for '/' (node-1/0 -> node-1_0.jsonl)."""
    return out / "telemetry" / f"{device.replace('/', '_')}.{suffix}"


@dataclass
class WorkerArgs:
    rank: int
    world: int
    init_method: str
    spec: ModelSpec
    training: Training
    plans: list[tuple[int, Plan]]  # (step it arrives, plan); versions are 1, 2, ... in this order
    out_dir: str
    data_root: str = "."  # the job's paths (data, init, checkpoints, resume) are relative to it
    slow: tuple[float, int] | None = None  # emulated straggler: (rate, from step)
    pace: float = 0.0  # a paced device's FLOP/s (the emulated GPU's tflops x mfu); 0: not paced
    netns: str = ""  # an emulated network's namespace to run in (a local run; agents start inside theirs)
    env: dict | None = None  # set before anything else (an emulated network's gloo interface and layout)
    ranks: dict[str, int] | None = None  # device id -> rank; default local/0..N-1
    # A directory an agent drops files into while the job runs: plan-V.json
    # (plan version V) and slow-NODE_INDEX.json ({"rate", "from_step"}, emulation).
    inbox: str | None = None
    # A job growing onto this device: (the world's generation, the version of plans[0] in it, the
    # plan the job's workers hold and their ranks before it). It joins and receives its parts.
    joining: tuple[int, int, Plan, dict[str, int]] | None = None
    log_file: str = ""  # stdout and stderr go here (an agent's workers: agent/logs.py); "": inherited
    starter: int = 0  # the pid of the process that started it (start_worker sets it): it ends with it


def start_worker(ctx, args: WorkerArgs, name: str):
    """A worker process, forked from the launcher and started."""
    proc = ctx.Process(target=_run_worker, args=(replace(args, starter=os.getpid()),), name=name)
    proc.start()
    return proc


def run_in_launcher(fn, *args, timeout_s: float = FORKED_TIMEOUT_S):
    """fn(*args) in a process forked from the worker launcher, where torch is imported (and
    the user's code or CUDA may be loaded without touching the agent); its result returned
    here, its error raised here as an OSError (a file) or a ValueError (anything else), with
    its cause. fn is a module-level function: it travels by name."""
    ctx = worker_context()
    receive, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=_call, args=(send, fn, *args), name=f"drover-{fn.__name__.strip('_')}")
    proc.start()
    send.close()
    try:
        if not receive.poll(timeout_s):
            raise ValueError(f"{fn.__name__.strip('_')} did not finish within {timeout_s:.0f} s")
        kind, value = receive.recv()
    except EOFError:
        proc.join()
        raise ValueError(f"{fn.__name__.strip('_')} exited with code {proc.exitcode}") from None
    finally:
        receive.close()
        if proc.is_alive():
            proc.kill()
        proc.join()
    if kind == "OSError":
        raise OSError(value)
    if kind == "ValueError":
        raise ValueError(value)
    return value


def check_inputs(spec: ModelSpec, training: Training, data_root: Path) -> None:
    """What a worker would find wrong before training, found before any worker starts: the
    user's model code builds what was planned, and the data, weights and checkpoint the job
    names are there and fit the model."""
    run_in_launcher(_check_inputs, spec, training, str(data_root))


def _run_worker(args: WorkerArgs) -> None:
    from .worker import worker_main  # preloaded by the launcher: no import here

    if args.starter:
        threading.Thread(target=_end_with, args=(args.starter,), name="starter-watch", daemon=True).start()
    worker_main(args)


def _end_with(starter: int) -> None:
    """SIGTERM to this worker once the process that started it (its agent, or drover train) has
    gone: an agent killed outright left its workers training, then idle on their ports for the
    300 s a lost peer is waited for. (The launcher outlives it: multiprocessing hands every
    worker a write end of the pipe whose closing would end the launcher.)"""
    try:
        fd = os.pidfd_open(starter)
    except (OSError, AttributeError):  # gone already, or no pidfd (not Linux 5.3+): poll instead
        fd = None
    if fd is not None:
        select.select([fd], [], [])  # readable once the process has exited
    else:
        while _alive(starter):
            time.sleep(1.0)
    os.kill(os.getpid(), signal.SIGTERM)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # PermissionError: alive, another user's
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    return True


def _check_inputs(spec: ModelSpec, training: Training, data_root: str) -> None:
    from .custom import check_counts
    from .inputs import open_inputs

    if spec.family == "custom":
        check_counts(spec)
    open_inputs(spec, training, data_root)


def _call(send, fn, *args) -> None:
    try:
        send.send(("", fn(*args)))
    except OSError as exc:
        send.send(("OSError", str(exc)))
    except Exception as exc:  # the user's code may raise anything; the caller's job fails with it
        send.send(("ValueError", str(exc) if isinstance(exc, ValueError) else f"{type(exc).__name__}: {exc}"))
