"""Links measured, as the control plane runs it over real gRPC and SQLite: a job on two nodes
has its links probed at start (each pair once, per network), the measurements are kept and
listed, and a link measured far slower than planned is judged for a new plan."""

from __future__ import annotations

from drover.v1 import agent_pb2, jobs_pb2

from support import TINY_JOB, eventually


def nics(address: str):
    return [
        agent_pb2.Nic(name="ib", type="infiniband", gbps=200.0, address=address),
        agent_pb2.Nic(name="eth", type="ethernet", gbps=10.0, address=address.replace("10.1", "10.3")),
    ]


async def started(plane):
    first = plane.agent("node-0", nics=nics("10.1.0.1"), probe_port=7001)
    second = plane.agent("node-1", nics=nics("10.1.0.2"), probe_port=7002)
    await plane.connected(2)
    job = await plane.submit(TINY_JOB)
    for agent in (first, second):
        assert (await agent.receive()).start_job.job_id == job.id
    return job, first, second


async def test_a_two_node_job_has_its_links_probed_and_a_slow_one_judged(plane):
    job, first, second = await started(plane)
    probe = (await first.receive()).command.probe_links  # node-0 probes; node-1 is probed
    assert probe.job_id == job.id
    assert {(t.nic, t.peer, t.address, t.port) for t in probe.targets} == {
        ("ib", "node-1", "10.1.0.2", 7002),
        ("eth", "node-1", "10.3.0.2", 7002),
    }
    assert all(64 << 10 <= t.bytes <= 64 << 20 for t in probe.targets)
    for step in range(6):  # both nodes run plan 1 long enough for it to be committed and judged
        for agent in (first, second):
            agent.report(job.id, step, {f"{agent.node}/0": 0.01, f"{agent.node}/1": 0.01})
    first.send(
        telemetry=agent_pb2.Telemetry(
            time=1.0,
            job_id=job.id,
            active_plan_version=1,
            links=[
                agent_pb2.LinkSample(nic="ib", peer="node-1", gbps=20.0, time=1.0),
                agent_pb2.LinkSample(nic="eth", peer="node-1", gbps=9.5, time=1.0),
            ],
        )
    )

    async def measured():
        return [e for e in await plane.events(job.id) if e.kind == "link_measured"]

    events = await eventually(lambda: _at_least(measured, 4), what="link_measured events")
    assert any('"nic": "ib"' in e.details_json and '"gbps": 20.0' in e.details_json for e in events)
    nodes = await plane.jobs.ListNodes(jobs_pb2.ListNodesRequest())
    links = {(n.name, k.nic, k.peer): k.gbps for n in nodes.nodes for k in n.links}
    assert links == {("node-0", "ib", "node-1"): 20.0, ("node-0", "eth", "node-1"): 9.5}

    async def judged():  # ib 10x slower than planned: a replan is weighed, pushed or skipped
        return [e for e in await plane.events(job.id) if e.kind in ("plan_pushed", "replan_skipped")]

    (decision, *_) = await eventually(judged, what="a decision on the slow link")
    assert "node-0:ib" in decision.details_json and "20.0" in decision.details_json


async def _at_least(events, count):
    found = await events()
    return found if len(found) >= count else None


async def test_links_to_a_node_outside_the_job_or_from_a_nic_it_lacks_are_dropped(plane):
    """A probe's result can arrive after its peer left the job: dropped, the stream goes on."""
    job, first, _ = await started(plane)
    first.send(
        telemetry=agent_pb2.Telemetry(
            time=1.0,
            job_id=job.id,
            links=[
                agent_pb2.LinkSample(nic="ib", peer="node-9", gbps=1.0, time=1.0),
                agent_pb2.LinkSample(nic="myri0", peer="node-1", gbps=1.0, time=1.0),
                agent_pb2.LinkSample(nic="ib", peer="node-1", gbps=150.0, time=1.0),
            ],
        )
    )

    async def kept():
        nodes = await plane.jobs.ListNodes(jobs_pb2.ListNodesRequest())
        return {(n.name, k.nic, k.peer): k.gbps for n in nodes.nodes for k in n.links} or None

    assert await eventually(kept, what="the one sound sample") == {("node-0", "ib", "node-1"): 150.0}
    assert "node-0" in plane.cp.outboxes  # its stream is still open
