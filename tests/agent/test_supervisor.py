"""The agent's side of names from the network: folders stay inside their
roots, and a job that cannot start here fails alone."""

from __future__ import annotations

import asyncio
import contextlib
import json

import grpc
import pytest

from drover.agent.supervisor import FailedHere, inside
from drover.storage import queries

from support import TINY_JOB, eventually


def test_inside_keeps_paths_in_their_root(tmp_path):
    assert inside(tmp_path, "runs/a") == (tmp_path / "runs" / "a").resolve()
    assert inside(tmp_path, ".") == tmp_path.resolve()
    for escape in ("../x", "/etc", "a/../../x"):
        with pytest.raises(ValueError, match="outside"):
            inside(tmp_path, escape)


def test_inside_follows_no_symlink_out(tmp_path):
    (tmp_path / "root").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "root" / "link").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ValueError, match="outside") as info:
        inside(tmp_path / "root", "link/out")
    assert str(tmp_path) not in str(info.value)  # a job's failure, which readers see, names no agent path


@pytest.mark.parametrize("linked", ["model.pt", "telemetry", "ckpt/step-4", "inside/deeper"])
def test_a_job_whose_folders_hold_a_link_out_of_the_data_root_does_not_start(tmp_path, linked):
    """A user who can write into the data root links a file the job writes (its model, its
    telemetry folder, a checkpoint) to one elsewhere: the job is refused, the file untouched."""
    from drover.agent.supervisor import JobWorkers

    root, elsewhere = tmp_path / "data", tmp_path / "elsewhere"
    (root / "out").mkdir(parents=True)
    (root / "ckpt").mkdir()
    elsewhere.mkdir()
    (elsewhere / "victim").write_text("precious")
    (root / "other").mkdir()
    (root / "out" / "inside").symlink_to(root / "other")  # stays in the root: allowed, and looked into
    target = root / ("out" if linked in ("model.pt", "telemetry") else "") / linked.replace("inside/", "other/")
    target.symlink_to(elsewhere / "victim")
    model = {"name": "t", "layers": 2, "hidden": 16, "ffn_hidden": 32, "heads": 2, "seq_len": 8, "vocab": 32}
    job = {"model": model | {"global_batch": 4, "micro_batch": 2}, "checkpoint": {"dir": "ckpt", "every_steps": 1}}
    with pytest.raises(ValueError, match="outside") as info:
        ranks, master = {"node-0/0": 0}, "tcp://127.0.0.1:1"
        JobWorkers("j1", job, 2, 0, 1, ranks, master, None, root / "out", "node-0", tmp_path, root)
    assert (elsewhere / "victim").read_text() == "precious" and list(elsewhere.iterdir()) == [elsewhere / "victim"]
    assert str(tmp_path) not in str(info.value)


def test_a_job_that_cannot_start_reports_failed_with_its_cause():
    job = FailedHere("workers could not start on node-0: out dir is read-only")
    assert job.state() == ("failed", "workers could not start on node-0: out dir is read-only")
    assert job.new_telemetry() == [] and job.active_version == 0


@pytest.mark.parametrize("job_id", ["../../x", "a/b", ".hidden", "", "x" * 200])
def test_a_job_id_names_no_folder_outside_the_inbox(tmp_path, job_id):
    from drover.agent.supervisor import JobWorkers

    with pytest.raises(ValueError, match="job id"):
        JobWorkers(job_id, {}, 1, 0, 1, {}, "tcp://127.0.0.1:1", None, tmp_path / "out", "node-0", tmp_path, tmp_path)
    assert list(tmp_path.iterdir()) == []  # nothing made anywhere


def test_a_jobs_inputs_are_checked_in_a_process_forked_from_the_launcher(tmp_path):
    """The agent never imports torch: a job's data, weights and checkpoint are opened (and a
    custom model built) in a process the worker launcher forks, and its error comes back here
    with the cause, as the agent's own check raised it before."""
    from drover.agent.runtime.handoff import check_inputs
    from drover.agent.supervisor import worker_job

    model = {"name": "t", "layers": 2, "hidden": 16, "ffn_hidden": 32, "heads": 2, "seq_len": 8, "vocab": 32}
    model |= {"global_batch": 4, "micro_batch": 2}
    spec, training = worker_job({"model": model}, 2, 0)
    check_inputs(spec, training, tmp_path)  # synthetic data: nothing to find
    (tmp_path / "shards").mkdir()
    spec, training = worker_job({"model": model, "data": "shards"}, 2, 0)
    with pytest.raises((OSError, ValueError), match="meta.json"):
        check_inputs(spec, training, tmp_path)
    spec, training = worker_job({"model": model, "resume": "nowhere"}, 2, 0)
    with pytest.raises(ValueError, match="nowhere"):
        check_inputs(spec, training, tmp_path)


def test_a_job_starts_off_the_agents_event_loop_and_stops_if_the_agent_stops_first():
    import asyncio
    import threading

    from drover.agent.daemon import off_the_loop

    release, stopped = threading.Event(), threading.Event()

    class SlowStart:  # a job whose worker launcher is still importing torch
        def __init__(self):
            release.wait(10)

        def stop(self):
            stopped.set()

    async def main():
        ticks = 0

        async def heartbeat():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.01)

        beating = asyncio.create_task(heartbeat())
        abandoned = set()
        starting = asyncio.create_task(off_the_loop(abandoned, SlowStart))
        await asyncio.sleep(0.2)
        assert ticks >= 5 and not starting.done()  # the loop ran while the job was starting
        starting.cancel()  # the agent stops
        await asyncio.sleep(0)
        assert len(abandoned) == 1  # for an agent that exits to wait on
        release.set()
        await asyncio.to_thread(stopped.wait, 10)
        beating.cancel()

    asyncio.run(main())
    assert stopped.is_set()  # what started after the agent stopped was stopped


def test_an_agent_that_exits_while_a_job_starts_waits_for_it_and_stops_its_workers(tmp_path):
    # The loop was gone by the time the start's thread ended, so nothing stopped what it had
    # started: drover up left a node's forkserver and workers running (3 runs in 7).
    import asyncio
    import threading

    from drover.agent.daemon import Agent, off_the_loop

    stopped = threading.Event()

    class SlowStart:
        def __init__(self):
            threading.Event().wait(0.5)  # still starting when the agent is told to stop

        def stop(self):
            stopped.set()

    async def main():
        agent = Agent("127.0.0.1:1", "node-0", work_dir=str(tmp_path / "w"), data_root=str(tmp_path))
        running = asyncio.create_task(agent.run_forever())  # no control plane: it keeps retrying
        starting = asyncio.create_task(off_the_loop(agent.abandoned, SlowStart))
        await asyncio.sleep(0.1)
        starting.cancel()
        running.cancel()  # SIGTERM
        with pytest.raises(asyncio.CancelledError):
            await running
        assert stopped.is_set()  # before the agent's run ended, not after

    asyncio.run(main())


async def test_an_agent_whose_node_another_agent_took_over_stops(plane):
    # Two agents started for one node took it from each other about once a second, forever.
    from drover.agent.daemon import Agent, AgentReplaced

    agent = Agent(
        f"127.0.0.1:{plane.port}", "node-0", cpu_devices=1, work_dir=str(plane.tmp / "w"), data_root=str(plane.tmp)
    )
    running = asyncio.create_task(agent.run_forever())
    await plane.connected(1)
    plane.agent("node-0")  # another process saying hello as node-0
    with pytest.raises(AgentReplaced, match="another agent now serves node node-0"):
        await asyncio.wait_for(running, 10)


async def test_an_idle_agent_knows_it_is_connected_once_its_hello_is_taken(plane):
    # It logged "connected" (and /metrics said so) only at its first job's start.
    from drover.agent.daemon import Agent

    agent = Agent(
        f"127.0.0.1:{plane.port}", "node-0", cpu_devices=1, work_dir=str(plane.tmp / "w"), data_root=str(plane.tmp)
    )
    running = asyncio.create_task(agent.run_forever())
    try:
        await eventually(lambda: agent.connected, timeout_s=10, what="connected with no job")
        assert agent.connections == 1
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_an_agent_refused_at_the_wrong_port_is_told_so_and_logs_no_asyncio_error(tmp_path, caplog):
    # Given the clients' port it read "UNIMPLEMENTED: Method not found!", and every refused try
    # left "aclose(): asynchronous generator is already running" in its log.
    import gc

    from drover.agent.daemon import Agent
    from drover.control_plane.server import start_server, stop_server

    served = await start_server(str(tmp_path / "d.db"), "127.0.0.1:0", agent_address="127.0.0.1:0")
    agent = Agent(
        f"127.0.0.1:{served.port}", "node-0", cpu_devices=1, work_dir=str(tmp_path / "w"), data_root=str(tmp_path)
    )
    running = asyncio.create_task(agent.run_forever())
    try:
        with caplog.at_level("INFO"):
            await eventually(lambda: "--agent-listen port" in caplog.text, timeout_s=10, what="told the port")
            await asyncio.sleep(1.5)  # a few refused tries
            gc.collect()
            await asyncio.sleep(0.1)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running
        await stop_server(served)
    assert not agent.connected
    assert [r.getMessage() for r in caplog.records if r.name == "asyncio"] == []


async def test_a_deleted_job_leaves_no_folder_in_the_agents_work_dir_but_its_output(plane):
    """drover job delete: the agent that ran the job removes its inbox and worker logs."""
    from drover.agent.daemon import Agent
    from drover.v1 import jobs_pb2, state_pb2

    work = plane.tmp / "w"
    agent = Agent(f"127.0.0.1:{plane.port}", "node-0", cpu_devices=1, work_dir=str(work), data_root=str(plane.tmp))
    running = asyncio.create_task(agent.run_forever())
    try:
        await plane.connected(1)
        job = await plane.submit()
        await eventually(lambda: (work / job.id / "logs").is_dir(), timeout_s=60, what="the job's folder")
        await plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))
        ended = await plane.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
        assert ended.state == state_pb2.JOB_STATE_CANCELLED
        await plane.jobs.DeleteJob(jobs_pb2.DeleteJobRequest(job_id=job.id))
        await eventually(lambda: not (work / job.id).exists(), timeout_s=30, what="the job's folder removed")
        assert (plane.tmp / ended.out_dir).is_dir()  # the output is the user's
        assert job.id not in agent.jobs
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_a_device_slowed_while_idle_is_slow_in_the_next_job_until_restored(plane):
    """Emulation: `drover straggle` before a job starts (the tour's order on a fast machine)
    answered 'now 3x slow' and changed nothing."""
    from drover.agent.daemon import Agent
    from drover.v1 import jobs_pb2

    work = plane.tmp / "w"
    agent = Agent(f"127.0.0.1:{plane.port}", "node-0", cpu_devices=1, work_dir=str(work), data_root=str(plane.tmp))
    running = asyncio.create_task(agent.run_forever())
    try:
        await plane.connected(1)
        await plane.jobs.Straggle(jobs_pb2.StraggleRequest(device="node-0/0", rate=3.0))
        await eventually(lambda: agent.straggled == {"node-0/0": 3.0}, what="the rate kept")
        job = await plane.submit()
        slow = work / job.id / "slow-node-0_0.json"
        await eventually(slow.exists, timeout_s=60, what="the job's worker told")
        assert json.loads(slow.read_text()) == {"rate": 3.0, "from_step": 0}
        await plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))
        await plane.jobs.Straggle(jobs_pb2.StraggleRequest(device="node-0/0", rate=1.0))
        await eventually(lambda: agent.straggled == {}, what="the device restored")
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_a_job_that_ends_while_the_control_plane_is_down_keeps_every_step_of_its_history(tmp_path):
    """Its agent reports it running in its hello until its steps are sent, then its end: the
    control plane took no step of a job it had ended, and the agent never forgot the job."""
    from drover.agent.daemon import Agent
    from drover.control_plane.server import start_server, stop_server
    from drover.v1 import jobs_pb2, jobs_pb2_grpc, state_pb2

    from support import serve_plane

    plane, stop = await serve_plane(tmp_path)
    port = plane.port
    agent = Agent(f"127.0.0.1:{port}", "node-0", cpu_devices=1, work_dir=str(tmp_path / "w"), data_root=str(tmp_path))
    running = asyncio.create_task(agent.run_forever())
    try:
        await plane.connected(1)
        job = await plane.submit(TINY_JOB.replace("steps: 30", "steps: 60"))
        await eventually(lambda: agent.connected and job.id in agent.jobs, what="the job started")
        await eventually(lambda: agent.jobs[job.id].step >= 2, timeout_s=60, what="a few steps")
        await stop()  # the control plane goes away mid-job
        await eventually(lambda: agent.jobs[job.id].state()[0] == "completed", timeout_s=120, what="the job's end")
        served = await start_server(str(tmp_path / "drover.db"), f"127.0.0.1:{port}", emulation=True)
        try:
            channel = grpc.aio.insecure_channel(f"127.0.0.1:{port}")
            jobs = jobs_pb2_grpc.JobServiceStub(channel)

            async def completed():
                got = await jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))
                return got.state == state_pb2.JOB_STATE_COMPLETED

            await eventually(completed, timeout_s=60, what="the job completed")
            await eventually(lambda: agent._ended_at.get(job.id) is not None, what="its end reported")
            await asyncio.sleep(1.5)  # a flush
            history = await jobs.QueryHistory(jobs_pb2.QueryHistoryRequest(job_id=job.id, page_size=1000))
            assert [p.step for p in history.points] == list(range(60))  # each once, in order
            await channel.close()
        finally:
            await stop_server(served)
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


async def test_after_a_worker_is_lost_its_recovery_plan_is_committed_and_the_job_goes_on(plane):
    """Failure review: the agent kept the dead worker's last telemetry line in its observed
    version, so the recovery plan was never committed and the control plane never replanned
    again for the job."""
    import os
    import signal

    from drover.agent.daemon import Agent
    from drover.v1 import jobs_pb2

    work = plane.tmp / "w"
    agent = Agent(f"127.0.0.1:{plane.port}", "node-0", cpu_devices=2, work_dir=str(work), data_root=str(plane.tmp))
    running = asyncio.create_task(agent.run_forever())
    try:
        await plane.connected(1)
        # One block: each device a pipeline of its own, a replica of the whole model.
        model = "{name: one, layers: 1, hidden: 64, ffn_hidden: 256, heads: 4, seq_len: 32, vocab: 128, "
        model += "global_batch: 16, micro_batch: 4}"
        job = await plane.submit(f"model: {model}\nsteps: 3000\nseed: 1\n")
        state = lambda: plane.jobs.GetJob(jobs_pb2.GetJobRequest(job_id=job.id))  # noqa: E731
        await eventually(lambda: job.id in agent.jobs and agent.jobs[job.id].step >= 3, timeout_s=60, what="steps")
        plan = (await plane.jobs.GetPlan(jobs_pb2.GetPlanRequest(job_id=job.id))).plan
        assert len(plan.pipelines) == 2, plan  # a replica on each device: one can be lost
        os.kill(agent.jobs[job.id].procs["node-0/1"].pid, signal.SIGKILL)
        await eventually(
            lambda: any(e.kind == "recovered" for e in plane.cp.store.read(lambda s: queries.events(s, job.id))),
            timeout_s=60,
            what="the recovery",
        )

        async def committed():
            now = await state()
            return now.plan_version >= 2 and now.committed_plan_version == now.plan_version

        await eventually(committed, timeout_s=30, what="the recovery plan committed")
        await plane.jobs.CancelJob(jobs_pb2.CancelJobRequest(job_id=job.id))
    finally:
        running.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await running


def test_after_a_long_outage_a_telemetry_message_stays_within_what_the_control_plane_takes(tmp_path):
    """Failure review: 1,584 device samples gathered while the control plane was down went up in
    one message; it was refused (at most 1,024), the stream ended, and they were lost with the
    steps waiting behind them."""
    from drover.agent.daemon import Agent
    from drover.control_plane.validation import check_bounds

    class Outage(FailedHere):  # a seam: a running job's files after 2,000 steps unsent
        def state(self):
            return "running", ""

        def new_telemetry(self):
            row = {"device": "node-0/0", "compute_s_per_block": 0.01, "p2p_wait_s": 0.0, "grad_sync_s": 0.0}
            return [row | {"step": s} for s in range(2000)]

        def new_progress(self):
            figures = {"loss": 1.0, "lr": 1e-3, "samples_per_s": 1.0, "tokens_per_s": 1.0}
            return [figures | {"step": s} for s in range(2000)]

    agent = Agent("127.0.0.1:1", "node-0", work_dir=str(tmp_path / "w"), data_root=str(tmp_path))
    workers = Outage("")
    workers.progress = {"step": 1999, "loss": 1.0, "lr": 1e-3, "samples_per_s": 1.0, "tokens_per_s": 1.0}
    (message,) = agent._job_messages("job-1", workers, [])
    check_bounds(message, "AgentMessage")  # what the control plane holds every message to
    assert [s.step for s in message.telemetry.devices] == list(range(1488, 2000))  # the newest
    assert [s.step for s in message.telemetry.steps] == list(range(256))  # the oldest: the rest follow
    assert message.telemetry.progress.step == 1999


def test_a_node_that_becomes_rank_0s_host_reads_the_traces_last_steps_again(tmp_path):
    """Failure review: the steps the lost rank 0's agent had not sent were missing from the
    history (steps 14 and 15 of 60); the new host read the shared trace from its end."""
    from drover.agent.supervisor import JobWorkers, line_near_end

    out = tmp_path / "out"
    (tmp_path / "inbox").mkdir()
    out.mkdir()
    lines = [json.dumps({"step": s, "loss": 1.0, "lr": 1e-3, "samples_per_s": 1.0}) + "\n" for s in range(2000)]
    (out / "trace.jsonl").write_text("".join(lines))
    workers = object.__new__(JobWorkers)  # only the state recover reads
    workers.node, workers.hosts_rank0, workers.out_dir, workers._offsets = "node-0", False, out, {}
    workers.inbox, workers.progress, workers.recent_steps, workers.tokens_per_sample = tmp_path / "inbox", None, [], 8
    workers.recover({"generation": 1}, {"node-0/0": 0, "node-1/0": 1})
    steps = [row["step"] for row in workers.new_progress()]
    assert steps == list(range(steps[0], 2000)) and 100 < len(steps) < 2000  # a whole line first, to the end
    assert line_near_end(out / "trace.jsonl", 10**9) == 0 and line_near_end(tmp_path / "none", 10) == 0
