"""Workers that survive a lost peer (recovery.py), with real processes and gloo:
one worker is SIGKILLed mid-run, the test hands the survivors a new world
(what the agent does for the control plane), and the job ends with the
single-process reference's model. From replicas when every part has a
surviving copy; from the newest checkpoint, every worker rolled back to the
same step, when some part lost every copy."""

from __future__ import annotations

import gc
import json
import os
import queue
import signal
import threading
import time
import weakref
from pathlib import Path

import pytest
import torch

from drover.agent.runtime import recovery
from drover.agent.runtime.handoff import WorkerArgs, worker_context
from drover.agent.runtime.launch import train_reference
from drover.agent.runtime.layout import holdings, lost_parts, surviving_holdings
from drover.agent.runtime.recovery import World, WorldWatch, peer_lost
from drover.agent.runtime.worker import worker_main
from drover.planner.model import load_model
from drover.planner.ports import free_port
from drover.planner.training import Checkpointing, Optimizer, Schedule, Training

from support import DP2_PP2, ROOT, UNEVEN, local_plan, trace

STEPS, SEED = 10, 3
TRAINING = Training(STEPS, SEED, Optimizer(clip_norm=0.5), Schedule(2, "cosine", 1e-4))
PP4 = local_plan((8, [([0], (0, 1)), ([1], (1, 2)), ([2], (2, 3)), ([3], (3, 4))]))
SURVIVORS_012 = local_plan((5, [([0], (0, 2)), ([1], (2, 4))]), (3, [([2], (0, 4))]))
SURVIVORS_013 = local_plan((8, [([0], (0, 2)), ([1], (2, 3)), ([3], (3, 4))]))


@pytest.fixture(scope="module")
def spec():
    return load_model(ROOT / "examples" / "models" / "tiny-llama.yaml")


@pytest.fixture(scope="module")
def reference(spec, tmp_path_factory):
    out = tmp_path_factory.mktemp("reference")
    train_reference(spec, TRAINING, out)
    return out


def start(spec, plan, training, out: Path, inbox: Path, slow_device: int, switches=()):
    init = f"tcp://127.0.0.1:{free_port()}"
    ctx = worker_context()
    procs = {}
    plans = [(0, plan), *switches]
    for rank in range(4):
        slow = (8.0, 0) if rank == slow_device else None  # slowed, so there is time to kill mid-run
        args = WorkerArgs(rank, 4, init, spec, training, plans, str(out), str(out.parent), slow, inbox=str(inbox))
        procs[rank] = ctx.Process(target=worker_main, args=(args,), name=f"worker-{rank}")
        procs[rank].start()
    return procs


def kill_after(procs, rank: int, out: Path, steps_done: int) -> None:
    deadline = time.monotonic() + 60
    while len(trace(out)) < steps_done if (out / "trace.jsonl").exists() else True:
        assert time.monotonic() < deadline, "the run did not get going"
        time.sleep(0.01)
    os.kill(procs[rank].pid, signal.SIGKILL)


def new_world(inbox: Path, survivors: list[int], plan) -> None:
    ranks = {f"local/{d}": i for i, d in enumerate(survivors)}
    world = World(1, f"tcp://127.0.0.1:{free_port()}", ranks, 2, plan)
    tmp = inbox / ".world.tmp"
    tmp.write_text(json.dumps(world.to_dict()))
    os.replace(tmp, inbox / "world-1.json")


def join_all(procs, survivors: list[int]) -> None:
    for rank in survivors:
        procs[rank].join(120)
        assert procs[rank].exitcode == 0, f"worker {rank} exited with {procs[rank].exitcode}"


def assert_reference_model(out: Path, reference: Path) -> None:
    want, got = torch.load(reference / "model.pt"), torch.load(out / "model.pt")
    for key in want:
        assert ((got[key] - want[key]).norm() / want[key].norm()).item() < 1e-4, key
    last = {row["step"]: row["loss"] for row in trace(out)}  # a redone step's later line wins
    assert sorted(last) == list(range(STEPS))
    assert [last[s] for s in range(STEPS)] == pytest.approx([r["loss"] for r in trace(reference)], rel=1e-5)


def test_a_killed_worker_whose_parts_have_replicas_is_recovered_from_them(spec, reference, tmp_path):
    inbox, out = tmp_path / "inbox", tmp_path / "run"
    inbox.mkdir()
    out.mkdir()
    procs = start(spec, DP2_PP2, TRAINING, out, inbox, slow_device=1)
    kill_after(procs, 3, out, steps_done=3)
    new_world(inbox, [0, 1, 2], SURVIVORS_012)
    join_all(procs, [0, 1, 2])
    assert_reference_model(out, reference)
    steps = [row["step"] for row in trace(out)]
    assert steps == sorted(set(steps)), "from replicas no step is redone"
    assert trace(out)[-1]["plan_version"] == 2
    (record,) = records(out)
    assert record["recovered_from"] == "replicas" and record["steps_redone"] == 0 and record["bytes_moved"] > 0


def test_a_killed_worker_with_the_only_copy_rolls_back_to_the_checkpoint(spec, reference, tmp_path):
    inbox, out = tmp_path / "inbox", tmp_path / "run"
    inbox.mkdir()
    out.mkdir()
    training = Training(**{**TRAINING.__dict__, "checkpoint": Checkpointing("ckpt", every_steps=2)})
    procs = start(spec, PP4, training, out, inbox, slow_device=0)
    kill_after(procs, 2, out, steps_done=3)
    new_world(inbox, [0, 1, 3], SURVIVORS_013)
    join_all(procs, [0, 1, 3])
    assert_reference_model(out, reference)
    steps = [row["step"] for row in trace(out)]
    assert len(steps) > len(set(steps)), "rolled back: some steps were run twice"
    (record,) = records(out)
    assert record["recovered_from"] == "checkpoint" and record["steps_redone"] == len(steps) - len(set(steps))


def test_a_worker_lost_in_the_middle_of_a_live_switch_is_recovered_from_replicas(spec, reference, tmp_path):
    """DP2-PP2 switching to UNEVEN at step 3, where local/3 is the source of block 2 for
    local/2: local/3 dies with its sends posted (die-local_3.json, emulation). Whatever each
    survivor got of the switch, none of them committed step 3, so all go back to what they
    held before it and recover from the replicas of DP2-PP2."""
    inbox, out = tmp_path / "inbox", tmp_path / "run"
    inbox.mkdir()
    out.mkdir()
    (inbox / "die-local_3.json").write_text("{}")
    procs = start(spec, DP2_PP2, TRAINING, out, inbox, slow_device=1, switches=[(3, UNEVEN)])
    procs[3].join(60)
    assert procs[3].exitcode == -signal.SIGKILL
    assert [row["step"] for row in trace(out)] == [0, 1, 2]  # it died in step 3's switch
    new_world(inbox, [0, 1, 2], SURVIVORS_012)
    join_all(procs, [0, 1, 2])
    assert_reference_model(out, reference)
    (record,) = records(out)
    assert record["recovered_from"] == "replicas" and record["step"] == 3


def test_a_worker_lost_after_a_switch_before_its_step_commits_is_recovered_from_the_plan_before(
    spec, reference, tmp_path
):
    """DP2-PP2 switching to UNEVEN at step 3, and local/3 killed once every worker is done
    switching, before step 3 runs: nobody commits step 3, so the survivors go back to DP2-PP2's
    parts and must recover from what DP2-PP2 placed, not from what UNEVEN would have."""
    inbox, out = tmp_path / "inbox", tmp_path / "run"
    inbox.mkdir()
    out.mkdir()
    (inbox / "die-local_3.json").write_text(json.dumps({"when": "after"}))
    procs = start(spec, DP2_PP2, TRAINING, out, inbox, slow_device=1, switches=[(3, UNEVEN)])
    procs[3].join(60)
    assert procs[3].exitcode == -signal.SIGKILL
    assert [row["step"] for row in trace(out)] == [0, 1, 2]
    new_world(inbox, [0, 1, 2], SURVIVORS_012)
    join_all(procs, [0, 1, 2])
    assert_reference_model(out, reference)
    switched, recovered = records(out)  # the switch was done (rank 0 wrote it), then undone
    assert "recovered_from" not in switched and switched["step"] == 3
    assert recovered["recovered_from"] == "replicas" and recovered["step"] == 3


def test_a_device_joining_a_running_job_receives_its_parts_and_the_world_grows(spec, reference, tmp_path):
    """Three workers on SURVIVORS_012; after step 3 a fourth starts, joining world 1 (four
    devices, DP2-PP2): the three move to it at a step boundary, the newcomer receives its
    parts peer to peer, and the job ends with the reference's model."""
    inbox, out = tmp_path / "inbox", tmp_path / "run"
    inbox.mkdir()
    out.mkdir()
    init = f"tcp://127.0.0.1:{free_port()}"
    ctx = worker_context()
    first = {f"local/{i}": i for i in range(3)}
    procs = {}
    for rank in range(3):
        slow = (8.0, 0) if rank == 1 else None
        args = WorkerArgs(rank, 3, init, spec, TRAINING, [(0, SURVIVORS_012)], str(out), str(tmp_path), slow,
                          ranks=first, inbox=str(inbox))  # fmt: skip
        procs[rank] = ctx.Process(target=worker_main, args=(args,))
        procs[rank].start()
    deadline = time.monotonic() + 60
    while not (out / "trace.jsonl").exists() or len(trace(out)) < 3:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    grown = World(1, f"tcp://127.0.0.1:{free_port()}", {f"local/{i}": i for i in range(4)}, 2, DP2_PP2)
    newcomer = WorkerArgs(3, 4, grown.init_method, spec, TRAINING, [(0, DP2_PP2)], str(out), str(tmp_path),
                          ranks=grown.ranks, inbox=str(inbox), joining=(1, 2, SURVIVORS_012, first))  # fmt: skip
    procs[3] = ctx.Process(target=worker_main, args=(newcomer,))
    procs[3].start()
    (inbox / ".w").write_text(json.dumps(grown.to_dict()))
    os.replace(inbox / ".w", inbox / "world-1.json")
    join_all(procs, [0, 1, 2, 3])
    assert_reference_model(out, reference)
    (record,) = records(out)
    assert record["joined"] == ["local/3"] and record["bytes_moved"] > 0
    assert trace(out)[-1]["plan_version"] == 2
    steps = [row["step"] for row in trace(out)]
    assert steps == sorted(set(steps))  # growing redoes nothing


def records(out: Path) -> list[dict]:
    return [json.loads(line) for line in (out / "migrations.jsonl").read_text().splitlines()]


def test_what_survives_of_a_plan():
    ranks = {f"local/{i}": i for i in range(4)}
    survivors = {"local/0": 0, "local/1": 1, "local/2": 2}
    before = surviving_holdings(DP2_PP2, ranks, survivors, 4)
    assert before == {
        part: {r: s for r, s in held.items() if r != 3} for part, held in holdings(DP2_PP2, ranks, 4).items()
    }
    assert lost_parts(before) == []
    pp = surviving_holdings(PP4, ranks, {"local/0": 0, "local/1": 1, "local/3": 2}, 4)
    assert lost_parts(pp) == [2]  # block 2 lived on local/2 alone


@pytest.mark.parametrize(
    "message, lost",
    [
        ("[pair.cc:537] Read error [127.0.0.1]:46752: Connection reset by peer", True),
        ("[pair.cc:553] Connection closed by peer [127.0.0.1]:44931", True),
        ("Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server shutdown or crash?", True),
        ("mat1 and mat2 shapes cannot be multiplied (2x3 and 4x5)", False),
    ],
)
def test_only_transport_failures_count_as_a_lost_peer(message, lost):
    assert peer_lost(RuntimeError(message)) is lost
    assert not peer_lost(ValueError(message))


def _leave_holding_a_group_in_the_plan_before_a_switch(init: str, started, done) -> None:
    """Rank 0: its TP group is held only by blocks of the plan it switched from (a switch not
    yet committed when the peer was lost); it leaves the world and stays alive."""
    import datetime

    import torch.distributed as dist

    from drover.agent.runtime import rejoining
    from drover.agent.runtime.tensor_parallel import WaitClock, join_group
    from drover.agent.runtime.worker import Worker

    rejoining.close_connections = list  # the groups must close with their last reference, not be shut

    dist.init_process_group("gloo", init_method=init, rank=0, world_size=2, timeout=datetime.timedelta(seconds=60))
    tp = dist.new_group([0, 1])
    block = torch.nn.Module()
    block.enter = block.exit = torch.nn.Identity()
    join_group(block, tp, WaitClock())
    worker = object.__new__(Worker)  # only the state _leave_world reads
    worker.groups, worker.tp_pg, worker.sync_pgs, worker.p2p_pgs = {(0, 1): tp}, tp, [], {}
    worker.parts, worker.previous = {}, (None, 0, {0: block}, {}, {}, None)
    worker.device_id, worker.generation = "local/0", 0
    del tp, block
    started.wait(30)
    time.sleep(1.0)  # rank 1 is blocked in the all-reduce by now
    worker._leave_world()
    done.wait(90)


def _wait_in_the_old_group(init: str, started, result) -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=1, world_size=2, timeout=datetime.timedelta(seconds=20))
    tp = dist.new_group([0, 1])
    began = time.perf_counter()
    started.set()
    try:
        dist.all_reduce(torch.ones(4), group=tp)
        result.put(("completed", time.perf_counter() - began))
    except RuntimeError as exc:
        result.put((str(exc)[:200], time.perf_counter() - began))


def test_a_worker_leaving_a_world_frees_the_groups_its_pre_switch_blocks_held():
    """A worker that loses a peer in the middle of a switch still holds the blocks of the plan
    before it (to go back to them). Their TP hooks must not keep the old world's groups, and
    so their sockets, alive: a peer blocked in that group learns the world is gone at once,
    not at the collective timeout."""
    outcome, seconds = _peer_of_a_leaving_worker(_leave_holding_a_group_in_the_plan_before_a_switch)
    assert peer_lost(RuntimeError(outcome)), outcome
    assert seconds < 20, f"the peer waited {seconds:.0f} s"


def _peer_of_a_leaving_worker(leave) -> tuple[str, float]:
    """Rank 0 runs `leave` (it leaves the world once rank 1 is blocked in an all-reduce on it);
    what rank 1's all-reduce ended with, and after how long."""
    ctx = worker_context()
    init = f"tcp://127.0.0.1:{free_port()}"
    started, done, result = ctx.Event(), ctx.Event(), ctx.Queue()
    leaving = ctx.Process(target=leave, args=(init, started, done))
    waiting = ctx.Process(target=_wait_in_the_old_group, args=(init, started, result))
    leaving.start()
    waiting.start()
    try:
        return result.get(timeout=40)
    except queue.Empty:
        pytest.fail("the peer was still blocked after 40 s: the leaving worker kept its connections open")
    finally:
        done.set()
        for proc in (leaving, waiting):
            proc.join(10)
            if proc.is_alive():
                proc.kill()


def _leave_while_something_still_holds_the_group(init: str, started, done) -> None:
    """Rank 0: leaves the world while a reference it forgot (a pending work, a frame) still
    holds its group, and stays alive."""
    import datetime

    import torch.distributed as dist

    from drover.agent.runtime.worker import Worker

    dist.init_process_group("gloo", init_method=init, rank=0, world_size=2, timeout=datetime.timedelta(seconds=60))
    forgotten = dist.new_group([0, 1])
    worker = object.__new__(Worker)  # only the state _leave_world reads
    worker.groups, worker.tp_pg, worker.sync_pgs, worker.p2p_pgs = {(0, 1): forgotten}, None, [forgotten], {}
    worker.parts, worker.previous, worker.device_id, worker.generation = {}, None, "local/0", 0
    started.wait(30)
    time.sleep(1.0)  # rank 1 is blocked in the all-reduce by now
    worker._leave_world()
    done.wait(90)
    assert forgotten is not None


def test_a_worker_leaving_a_world_frees_its_peers_even_while_something_holds_its_groups():
    """The survivor that learns first that a peer is gone leaves the world; another survivor
    may be blocked in a collective waiting on it (not on the dead peer). It must learn at once,
    even if a reference the leaving worker kept holds the group: its connections are shut."""
    outcome, seconds = _peer_of_a_leaving_worker(_leave_while_something_still_holds_the_group)
    assert peer_lost(RuntimeError(outcome)), outcome
    assert seconds < 10, f"the peer waited {seconds:.0f} s"


def _stay_in_the_world_without_a_word(init: str, done) -> None:
    """Rank 0: alive and connected, but it never joins rank 1's collective (a peer that left
    the world while keeping its connections open, or one waiting elsewhere)."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=0, world_size=2, timeout=datetime.timedelta(seconds=90))
    done.wait(90)


def _wait_in_a_world_the_inbox_ends(init: str, inbox: str, result, waits_in: str) -> None:
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=init, rank=1, world_size=2, timeout=datetime.timedelta(seconds=90))
    watch = WorldWatch(Path(inbox), poll_s=0.05)
    watch.enter(0, ["local/0", "local/1"])
    result.put((waits_in, 0.0))
    began = time.perf_counter()
    try:
        if waits_in == "an all-reduce":
            dist.all_reduce(torch.ones(4))  # freed by the watch's closing its connections
        else:
            watch.wait(dist.isend(torch.ones(64 << 20), 0))  # 256 MB: more than the socket's buffers hold
        result.put(("completed", time.perf_counter() - began))
    except RuntimeError as exc:
        result.put((str(exc)[:200], time.perf_counter() - began))


@pytest.mark.parametrize("waits_in", ["an all-reduce", "a send"])
def test_a_worker_blocked_in_a_world_that_lost_a_member_is_freed_once_the_next_world_is_named(tmp_path, waits_in):
    """Rank 1 waits on rank 0, which is alive and connected but never joins its all-reduce or
    takes what it sends. Once the inbox names world 1 without local/0, rank 1's watch ends
    world 0: the wait fails as a lost peer in seconds, not at the 90 s timeout. (Gloo completes
    a send only inside its wait: a watch polling it for completion waited for good even on a
    live peer.)"""
    ctx = worker_context()
    init = f"tcp://127.0.0.1:{free_port()}"
    done, result = ctx.Event(), ctx.Queue()
    silent = ctx.Process(target=_stay_in_the_world_without_a_word, args=(init, done))
    waiting = ctx.Process(target=_wait_in_a_world_the_inbox_ends, args=(init, str(tmp_path), result, waits_in))
    silent.start()
    waiting.start()
    try:
        assert result.get(timeout=60)[0] == waits_in
        time.sleep(1.0)  # rank 1 blocked in it by now
        assert result.empty()
        new_world(tmp_path, [1], local_plan((8, [([1], (0, 4))])))
        outcome, seconds = result.get(timeout=60)
    finally:
        done.set()
        for proc in (silent, waiting):
            proc.join(10)
            if proc.is_alive():
                proc.kill()
    assert peer_lost(RuntimeError(outcome)), outcome
    assert seconds < 30, f"rank 1 waited {seconds:.0f} s"


def test_a_world_watch_fires_once_for_a_world_that_leaves_a_member_out_and_never_for_growth(tmp_path, monkeypatch):
    """The watch of world 0 (local/0, local/1): world 1 growing onto local/2 ends nothing; world
    2 without local/0 ends it, once; a worker that has left the world is not watched."""
    closes = []
    monkeypatch.setattr(recovery, "close_connections", lambda: closes.append(time.monotonic()) or [])

    def name_world(generation: int, devices: list[str]) -> None:  # the watch reads the ranks alone
        ranks = {d: r for r, d in enumerate(devices)}
        (tmp_path / f"world-{generation}.json").write_text(json.dumps({"generation": generation, "ranks": ranks}))

    def settle() -> None:
        time.sleep(0.3)  # six polls

    watch = WorldWatch(tmp_path, poll_s=0.05)
    watch.enter(0, ["local/0", "local/1"])
    name_world(1, ["local/0", "local/1", "local/2"])
    settle()
    assert closes == []
    name_world(2, ["local/1", "local/2"])
    settle()
    assert len(closes) == 1
    settle()
    assert len(closes) == 1  # once
    left = WorldWatch(tmp_path, poll_s=0.05)
    left.enter(0, ["local/0", "local/1"])
    left.leave()
    settle()
    assert len(closes) == 1


class _NeverEnds:
    """A collective gloo never ends (a send pending to a dead peer: seen in a kill run)."""

    def wait(self):
        threading.Event().wait()  # for good, in the watch's waiting thread


def test_a_collective_left_pending_is_given_up_once_the_world_is_found_over(tmp_path):
    watch = WorldWatch(tmp_path, poll_s=0.05)
    watch.enter(0, ["local/0", "local/1"])
    pending, group = _NeverEnds(), object()
    new_world(tmp_path, [1], local_plan((8, [([1], (0, 4))])))  # local/0 is gone
    began = time.perf_counter()
    with pytest.raises(RuntimeError) as info:
        watch.wait(pending, group)
    assert peer_lost(info.value) and time.perf_counter() - began < 5
    assert recovery.ABANDONED[-1] == (pending, group)  # kept: destroying its group would block
    watch.enter(1, ["local/1"])  # the next world: collectives are waited for again
    assert not watch.ended.is_set()


class _NothingCompletes:
    """torch.distributed as a dead peer leaves it: sends, receives and collectives are posted,
    and none ever completes."""

    class ReduceOp:
        MAX = MIN = SUM = None

    def __init__(self, rank: int):
        self.rank, self.posted = rank, []

    def get_rank(self) -> int:
        return self.rank

    def _post(self, *args, **kwargs) -> _NeverEnds:
        self.posted.append(_NeverEnds())
        return self.posted[-1]

    isend = irecv = all_gather = all_reduce = barrier = _post


class _Tokens:
    def __init__(self, seq_len: int):
        self.seq_len = seq_len

    def batch(self, step: int, first: int, count: int):
        tokens = torch.zeros(count, self.seq_len, dtype=torch.long)
        return tokens, tokens


@pytest.mark.parametrize(
    "stage, forward_only, waits_on",
    [(1, False, "an activation"), (0, True, "its sends"), (0, False, "a gradient")],
)
def test_a_stage_waiting_on_a_peer_that_is_gone_gives_up_once_its_world_is_over(
    spec, tmp_path, monkeypatch, stage, forward_only, waits_on
):
    """Every message of a stage is waited for through the worker's watch: a send pending to a
    dead peer (which gloo ends only at its 5-minute timeout, as a kill run once showed) or a
    receive from it is given up once the inbox names a world without that peer."""
    from drover.agent.runtime import layout, schedule
    from drover.agent.runtime.model import build_part, config_of
    from drover.agent.runtime.tensor_parallel import WaitClock

    fake = _NothingCompletes(stage)
    monkeypatch.setattr(schedule, "dist", fake)
    watch = WorldWatch(tmp_path, poll_s=0.05)
    watch.enter(0, ["local/0", "local/1"])
    plan = local_plan((8, [([0], (0, 2)), ([1], (2, 4))]))
    role = layout.roles(plan, {"local/0": 0, "local/1": 1})[stage]
    parts = {part: build_part(config_of(spec), part, SEED) for part in role.parts}
    new_world(tmp_path, [1 - stage], plan)
    began = time.perf_counter()
    with pytest.raises(RuntimeError) as info:
        schedule.run_stage(
            role,
            parts,
            spec,
            _Tokens(spec.seq_len),
            0,
            torch.device("cpu"),
            WaitClock(watch.wait),
            None,
            forward_only=forward_only,
        )
    assert peer_lost(info.value), waits_on
    assert time.perf_counter() - began < 10 and fake.posted, waits_on


def test_a_tensor_parallel_all_reduce_waiting_on_a_partner_that_is_gone_gives_up_once_its_world_is_over(
    tmp_path, monkeypatch
):
    from drover.agent.runtime import tensor_parallel

    monkeypatch.setattr(tensor_parallel, "dist", _NothingCompletes(0))
    watch = WorldWatch(tmp_path, poll_s=0.05)
    watch.enter(0, ["local/0", "local/1"])
    new_world(tmp_path, [1], local_plan((8, [([1], (0, 4))])))
    clock = tensor_parallel.WaitClock(watch.wait)
    with pytest.raises(RuntimeError) as info:
        clock.all_reduce(torch.ones(4), group=object())
    assert peer_lost(info.value) and clock.seconds == 0.0


def test_a_wait_that_failed_or_was_given_up_keeps_nothing_alive(tmp_path):
    """A failed wait's error, raised in the worker, holds the worker's frames (a step's groups
    and sockets): the watch's waiting thread must not keep it once raised, or the lost world's
    groups outlive the worker's leaving it. A thread left waiting on a given-up work ends once
    that work does."""

    class Failing:
        def wait(self):
            raise RuntimeError("Connection closed by peer")

    class Held:
        pass

    watch = WorldWatch(tmp_path, poll_s=0.05)
    watch.enter(0, ["local/0", "local/1"])
    held = []

    def step():
        frame_local = Held()
        held.append(weakref.ref(frame_local))
        watch.wait(Failing())

    with pytest.raises(RuntimeError) as info:
        step()
    assert peer_lost(info.value)
    del info
    deadline = time.monotonic() + 5
    while held[0]() is not None and time.monotonic() < deadline:
        gc.collect()
        time.sleep(0.01)
    assert held[0]() is None

    released = threading.Event()

    class Blocked:
        def wait(self):
            released.wait()

    def waiters() -> int:
        return sum(t.name == "work-waiter" and t.is_alive() for t in threading.enumerate())

    before = waiters()
    new_world(tmp_path, [1], local_plan((8, [([1], (0, 4))])))  # local/0 is gone
    with pytest.raises(RuntimeError):
        watch.wait(Blocked())
    assert waiters() == before + 1  # the given-up work's, and the next wait's
    released.set()
    deadline = time.monotonic() + 5
    while waiters() > before and time.monotonic() < deadline:
        time.sleep(0.01)
    assert waiters() == before
