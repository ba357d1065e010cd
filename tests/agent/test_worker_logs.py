"""An agent sending a job's worker logs (agent/logs.py): tails, following, bounds."""

from __future__ import annotations

import asyncio

from drover.agent import logs
from drover.v1 import agent_pb2


def job_folder(tmp_path, texts: dict[str, bytes]):
    folder = tmp_path / "job-1" / "logs"
    folder.mkdir(parents=True)
    for device, text in texts.items():
        logs.log_file(tmp_path / "job-1", device).write_bytes(text)
    return folder


async def serve(tmp_path, running=lambda: False, **request):
    sent = []
    ask = agent_pb2.ReadLogs(request_id="r1", job_id="job-1", **request)
    await logs.send_logs(tmp_path, "node-1", ask, sent.append, running)
    return [m.log_chunk for m in sent]


def joined(chunks, device):
    return b"".join(c.data for c in chunks if c.device == device)


async def test_the_tail_of_each_log_in_chunks_then_the_end(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "CHUNK_BYTES", 10)
    job_folder(tmp_path, {"node-1/0": b"a" * 25 + b"END0", "node-1/1": b"short"})
    chunks = await serve(tmp_path, tail_bytes=12)
    assert joined(chunks, "node-1/0") == b"a" * 8 + b"END0" and joined(chunks, "node-1/1") == b"short"
    assert all(len(c.data) <= 10 for c in chunks) and all(c.request_id == "r1" for c in chunks)
    assert [c.end for c in chunks].count(True) == 1 and chunks[-1].end and not chunks[-1].note


async def test_one_device_only_and_none_of_another_nodes(tmp_path):
    job_folder(tmp_path, {"node-1/0": b"zero", "node-1/1": b"one"})
    chunks = await serve(tmp_path, devices=["node-1/1", "node-0/0"])
    assert {c.device for c in chunks if c.data} == {"node-1/1"}


async def test_following_sends_what_is_written_until_the_job_ends(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "FOLLOW_EVERY_S", 0.01)
    job_folder(tmp_path, {"node-1/0": b"first\n"})
    state = {"running": True}

    async def write_then_end():
        await asyncio.sleep(0.05)
        with open(logs.log_file(tmp_path / "job-1", "node-1/0"), "ab") as f:
            f.write(b"second\n")
        await asyncio.sleep(0.05)
        with open(logs.log_file(tmp_path / "job-1", "node-1/0"), "ab") as f:
            f.write(b"last words\n")
        state["running"] = False

    writer = asyncio.create_task(write_then_end())
    chunks = await serve(tmp_path, running=lambda: state["running"], follow=True)
    await writer
    assert joined(chunks, "node-1/0") == b"first\nsecond\nlast words\n"
    assert chunks[-1].end


async def test_no_logs_or_a_bad_job_id_end_with_why(tmp_path):
    assert "no worker logs of job-1 on node-1" in (await serve(tmp_path))[-1].note
    sent = []
    bad = agent_pb2.ReadLogs(request_id="r", job_id="../../etc")
    await logs.send_logs(tmp_path, "node-1", bad, sent.append, lambda: False)
    assert sent[-1].log_chunk.end and "not a job id" in sent[-1].log_chunk.note


async def test_each_chunk_waits_for_credit_given_as_the_reader_takes_them(tmp_path, monkeypatch):
    monkeypatch.setattr(logs, "CHUNK_BYTES", 1)
    job_folder(tmp_path, {"node-1/0": b"abcdef"})
    sent, credit = [], logs.Credit(2)
    ask = agent_pb2.ReadLogs(request_id="r1", job_id="job-1", window=2)
    sender = asyncio.create_task(logs.send_logs(tmp_path, "node-1", ask, sent.append, lambda: False, credit))
    await asyncio.sleep(0.05)
    assert [m.log_chunk.data for m in sent] == [b"a", b"b"]  # the window, then it waits
    credit.give(3)
    await asyncio.sleep(0.05)
    assert len(sent) == 4  # a window never grows past its size: 2 more, not 3
    credit.give(2)
    await sender
    assert b"".join(m.log_chunk.data for m in sent) == b"abcdef" and sent[-1].log_chunk.end
