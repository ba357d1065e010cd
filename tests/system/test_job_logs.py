"""`drover job logs`: workers' output captured by their agents and read
through the control plane, with real processes and TLS."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from drover.cli.local_cluster import DROVER, LocalCluster
from drover.cli.models import ModelReader
from drover.v1 import state_pb2

from support import ROOT

pytestmark = pytest.mark.slow

EXPLODING = """
import torch.distributed as dist
from parallel_decoder import ParallelBlock, build


class ExplodingBlock(ParallelBlock):
    def forward(self, x):
        if x.device.type == "meta" or dist.get_rank() < 2:  # drover's shape check; node-0's ranks
            return super().forward(x)
        print("about to explode", flush=True)
        raise RuntimeError("the user's block exploded")


def build_exploding(config, part, seed):
    if dist.is_initialized():  # a worker's, not drover's shape check: every worker's log has a line
        print(f"building part {part}", flush=True)
    return ExplodingBlock(config) if isinstance(part, int) else build(config, part, seed)
"""


def logs(c: LocalCluster, *args: str) -> subprocess.CompletedProcess:
    target = ["--control-plane", c.address, "--ca", str(c.certs / "ca.pem")]
    target += ["--token-file", str(c.certs / "operator.token")]
    return subprocess.run(DROVER + ["job", "logs", *args, *target], capture_output=True, text=True, timeout=60)


def test_job_logs_returns_a_workers_traceback_from_another_nodes_agent(tmp_path):
    models = tmp_path / "models"
    models.mkdir()
    shutil.copy(ROOT / "examples" / "models" / "parallel_decoder.py", models)
    (models / "exploding_model.py").write_text(EXPLODING)
    model = (ROOT / "examples" / "models" / "parallel-decoder.yaml").read_text()
    (models / "exploding.yaml").write_text(model.replace("parallel_decoder:build", "exploding_model:build_exploding"))
    (tmp_path / "job.yaml").write_text(f"model: {models / 'exploding.yaml'}\nsteps: 5\nseed: 0\n")
    reader = ModelReader()
    with LocalCluster(tmp_path, model_modules=("exploding_model",), python_path=(str(models),)) as c:
        job = c.submit(tmp_path / "job.yaml", "out", reader=reader)
        final = c.wait_until(
            lambda: c.job(job.id) if c.job(job.id).state != state_pb2.JOB_STATE_RUNNING else None, 120, "the job's end"
        )
        assert final.state == state_pb2.JOB_STATE_FAILED
        run = logs(c, job.id, "--node", "node-1")
        assert run.returncode == 0, run.stderr
        lines = run.stdout.splitlines()
        assert lines and all(line.startswith(("[node-1/0] ", "[node-1/1] ")) for line in lines)
        assert any("Traceback (most recent call last)" in line for line in lines)
        assert "[node-1/0] RuntimeError: the user's block exploded" in lines
        assert "[node-1/0] about to explode" in lines  # a print of the user's code, stdout too
        one = logs(c, job.id, "--worker", "node-0/1", "--tail", "200")
        assert one.returncode == 0 and one.stdout.strip()
        assert {line.split("]")[0] for line in one.stdout.splitlines()} == {"[node-0/1"}
        assert len(one.stdout.encode()) <= 200 + len("[node-0/1] ") * one.stdout.count("\n") + 20
        # A reader's token may not read logs; an unknown node is named.
        reader_token = ["--token-file", str(c.certs / "reader.token")]
        denied = subprocess.run(
            DROVER
            + ["job", "logs", job.id, "--control-plane", c.address, "--ca", str(c.certs / "ca.pem")]
            + reader_token,
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert denied.returncode == 1 and "PERMISSION_DENIED" in denied.stderr
        unknown = logs(c, job.id, "--node", "node-7")
        assert unknown.returncode == 1 and "NOT_FOUND: unknown node 'node-7'" in unknown.stderr
        assert "node-0, node-1" in unknown.stderr
        # A device of a node of the job that is none of its devices was an empty answer.
        unknown = logs(c, job.id, "--worker", "node-0/9")
        assert unknown.returncode == 1 and "NOT_FOUND: unknown device 'node-0/9'" in unknown.stderr
        assert "node-0/0, node-0/1" in unknown.stderr
