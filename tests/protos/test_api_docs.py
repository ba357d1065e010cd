"""docs/api.md is what scripts/gen_api_docs.py makes from the protos and their comments."""

from __future__ import annotations

import subprocess
import sys

import pytest

from support import ROOT


def test_the_api_reference_is_current(tmp_path):
    pytest.importorskip("grpc_tools")
    fresh = tmp_path / "api.md"
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen_api_docs.py"), str(fresh)], check=True, cwd=ROOT)
    assert fresh.read_text() == (ROOT / "docs" / "api.md").read_text(), "run python scripts/gen_api_docs.py"
    text = fresh.read_text()
    for rpc in ("SubmitJob", "WatchEvents", "StreamLogs", "QueryHistory", "Connect"):
        assert f"Service.{rpc}" in text
    assert "drover.v1.JobService/GetJob" in text and "stub.GetJob(jobs_pb2.GetJobRequest(job_id=" in text
