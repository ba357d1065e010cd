"""examples/slurm/drover.sbatch on an emulated one-node allocation named localhost: scontrol,
srun and hostname are shims that run the node's tasks here, on free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from drover.planner.ports import free_port

from support import ROOT

pytestmark = pytest.mark.slow

SHIMS = {
    "hostname": 'echo "${FAKE_HOST:-$(/bin/hostname)}"\n',
    "scontrol": '[ "$1 $2" = "show hostnames" ] && tr \',\' \'\\n\' <<<"$3"\n',
    # Runs the command once per node of the allocation (or on -w NODE), as that node.
    "srun": """nodes=$(tr ',' ' ' <<<"$SLURM_JOB_NODELIST"); w=""
while [[ $# -gt 0 && $1 == -* ]]; do case $1 in -w) w=$2; shift 2;; *) shift;; esac; done
[ -n "$w" ] && nodes=$w
pids=()
for n in $nodes; do FAKE_HOST=$n "$@" & pids+=($!); done
trap 'kill "${pids[@]}" 2>/dev/null' TERM INT
wait
""",
}


@pytest.fixture
def allocation(tmp_path):
    """run(job_id) submits the script for a one-node allocation named localhost."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, body in SHIMS.items():
        (bin_dir / name).write_text("#!/bin/bash\n" + body)
        (bin_dir / name).chmod(0o755)
    ports = {str(p): str(free_port()) for p in (50051, 50052, 50053, 9464, 9465)}
    script = (
        (ROOT / "examples" / "slurm" / "drover.sbatch").read_text().replace("/tmp/drover-agent", str(tmp_path / "w"))
    )
    for fixed, free in ports.items():
        script = script.replace(fixed, free)
    (tmp_path / "drover.sbatch").write_text(script)
    job = tmp_path / "job.yaml"
    job.write_text(f"model: {ROOT / 'examples' / 'models' / 'tiny.yaml'}\nsteps: 4\nseed: 0\n")

    def run(job_id: str) -> subprocess.CompletedProcess:
        env = os.environ | {
            "PATH": f"{bin_dir}:{Path(sys.executable).parent}:{os.environ['PATH']}",
            "SLURM_JOB_NODELIST": "localhost",
            "SLURM_JOB_ID": job_id,
            "SLURM_JOB_NUM_NODES": "1",
            "DROVER_AGENT_CPU_DEVICES": "2",
            "GLOO_SOCKET_IFNAME": "lo",
            "NCCL_SOCKET_IFNAME": "lo",
        }
        command = ["bash", str(tmp_path / "drover.sbatch"), str(job)]
        return subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)

    run.ports = {fixed: int(free) for fixed, free in ports.items()}
    return run


def test_the_slurm_script_keeps_the_ca_key_off_the_nodes_and_runs_again(allocation, tmp_path):
    # It made every credential in the shared folder and gave all of it to every node (ca.key, the
    # admin token), and a second allocation reused them and failed.
    for job_id in ("101", "102"):
        run = allocation(job_id)
        assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
        assert "job_completed" in run.stdout
        shared = tmp_path / "drover-shared" / f"run-{job_id}"
        assert sorted(p.name for p in (shared / "nodes" / "localhost").iterdir()) == [
            "ca.pem",
            "node-localhost.key",
            "node-localhost.pem",
        ]
        everything = [p.name for p in (tmp_path / "drover-shared").rglob("*")]
        assert "ca.key" not in everything and not [n for n in everything if n.endswith(".token")]
        assert (shared / "server" / "server.key").stat().st_mode & 0o077 == 0


def test_a_control_plane_that_cannot_start_ends_the_script_with_where_to_look(allocation, tmp_path):
    with socket.socket() as taken:  # the clients' port, held by something else
        taken.bind(("0.0.0.0", allocation.ports["50051"]))
        started = time.monotonic()
        run = allocation("103")
    assert run.returncode == 1 and "the control plane exited" in run.stderr, run.stderr[-2000:]
    assert time.monotonic() - started < 100  # not the 120 s that nodes are given to connect
    assert "cannot listen" in (tmp_path / "drover-shared" / "run-103" / "logs" / "server.log").read_text()
