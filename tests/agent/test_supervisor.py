"""The agent's side of names from the network: folders stay inside their
roots, and a job that cannot start here fails alone."""

from __future__ import annotations

import pytest

from drover.agent.supervisor import FailedHere, inside


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
    with pytest.raises(ValueError, match="outside"):
        inside(tmp_path / "root", "link/out")


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
