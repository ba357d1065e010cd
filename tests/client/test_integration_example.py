"""examples/integrations/place_and_follow.py, run as an integrator would: from a directory
outside the checkout, with only public imports (drover.client) and the plugin's fixtures."""

from __future__ import annotations

import shutil

from support import ROOT

pytest_plugins = ["pytester"]


def test_the_example_places_a_job_off_a_drained_node_and_follows_it(pytester):
    shutil.copy(ROOT / "examples" / "integrations" / "place_and_follow.py", pytester.path)
    shutil.copytree(ROOT / "examples" / "models", pytester.path / "models")
    (pytester.path / "job.yaml").write_text("model: models/tiny.yaml\nsteps: 30\nseed: 0\n")
    pytester.makepyfile(
        test_scheduler="""
        import json

        import place_and_follow
        from drover.client import Client


        def test_scheduler(drover_control_plane, drover_agent, capsys):
            drover_agent("node-0")
            drover_agent("node-1")
            drover_agent("node-2", rates={"node-2/1": 3.0})
            code = place_and_follow.main(
                ["job.yaml", "--control-plane", drover_control_plane.address, "--drain", "node-1"]
            )
            assert code == 0
            report = json.loads(capsys.readouterr().out)
            assert report["state"] == "completed"
            assert report["nodes"] == ["node-0", "node-2"]  # never the drained node
            assert report["stragglers"] == {"node-2/1": 3.0}  # read from the typed payloads
            assert report["events"][0] == "job_started" and report["events"][-1] == "job_completed"
            nodes = {n.name: n.drained for n in Client(drover_control_plane.address).nodes()}
            assert nodes == {"node-0": False, "node-1": False, "node-2": False}  # given back
        """
    )
    assert not str(pytester.path).startswith(str(ROOT))
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-q")
    result.assert_outcomes(passed=1)
