"""The wire contract: committed generated code is what the pinned generator
makes, and the Plan message's JSON form is the spec's plan format."""

from __future__ import annotations

import filecmp
import json
import subprocess

import pytest
from google.protobuf import json_format

from drover.planner.plan import load_plan
from drover.planner.wire import plan_from_proto, plan_to_proto

from support import ROOT

GENERATED = sorted(p.name for p in (ROOT / "protos" / "drover" / "v1").glob("*_pb2*.py*"))


def test_generated_code_is_up_to_date(tmp_path):
    pytest.importorskip("grpc_tools")
    env_path = f"{ROOT / '.venv' / 'bin'}:{__import__('os').environ['PATH']}"
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "gen_protos.sh"), str(tmp_path)], check=True, env={"PATH": env_path}, cwd=ROOT
    )
    fresh = sorted(p.name for p in (tmp_path / "drover" / "v1").iterdir() if "_pb2" in p.name)
    assert fresh == GENERATED
    for name in GENERATED:
        assert filecmp.cmp(
            tmp_path / "drover" / "v1" / name, ROOT / "protos" / "drover" / "v1" / name, shallow=False
        ), f"{name} differs: run scripts/gen_protos.sh and commit"


def test_plan_json_is_the_spec_format(spec_examples):
    for path in sorted(spec_examples.glob("*/plan.json")):
        plan = load_plan(path)
        message = plan_to_proto(plan)
        assert plan_from_proto(message) == plan
        on_wire = json_format.MessageToDict(message, preserving_proto_field_name=True)
        assert on_wire["pipelines"] == json.loads(path.read_text())["pipelines"]


def test_predicted_survives_the_round_trip():
    from drover.planner.search import make_plan

    from support import make_cluster, make_model

    plan = make_plan(make_cluster("one-straggler"), make_model("gpt-1b"))
    back = plan_from_proto(plan_to_proto(plan))
    assert back == plan and back.predicted == plan.predicted
