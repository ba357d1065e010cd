"""An integration written against drover.client alone: a scheduler's loop in miniature.

It keeps one node out of placement (drain), submits a job that must land on the others,
follows its events to the end, then gives the node back (undrain) and reports what it saw
as JSON. Run it against any control plane:

    python examples/integrations/place_and_follow.py --control-plane HOST:50051 \\
        --ca certs/ca.pem --token-file certs/operator.token --drain node-1 examples/jobs/tiny.yaml

Its test (tests/client/test_integration_example.py) runs it, from outside the checkout,
against the pytest plugin's in-process control plane and simulated agents.
"""

from __future__ import annotations

import argparse
import json
import sys

from drover.client import Client, DroverError, EventKind, Target


def place_and_follow(client: Client, job_file: str, drain: list[str]) -> dict:
    for node in drain:
        client.drain(node)
    try:
        job = client.submit_file(job_file)
        kinds, nodes, stragglers = [], [], {}
        for event in client.watch(job.id):  # until the job ends
            kinds.append(event.kind)
            if event.type == EventKind.EVENT_KIND_JOB_STARTED:
                nodes = list(event.payload.nodes)
            elif event.type == EventKind.EVENT_KIND_STRAGGLER_DETECTED:
                stragglers[event.payload.device] = event.payload.rate
        return {"job": job.id, "state": client.wait(job.id), "nodes": nodes, "stragglers": stragglers, "events": kinds}
    finally:
        for node in drain:
            client.undrain(node)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("job_file")
    parser.add_argument("--control-plane", default="127.0.0.1:50051")
    parser.add_argument("--ca", help="The cluster's CA (none: a loopback server started with --insecure).")
    parser.add_argument("--token-file")
    parser.add_argument("--drain", action="append", default=[], help="A node to keep the job off; repeatable.")
    args = parser.parse_args(argv)
    target = Target.from_files(args.control_plane, args.ca, args.token_file) if args.ca else Target(args.control_plane)
    try:
        with Client(target) as client:
            print(json.dumps(place_and_follow(client, args.job_file, args.drain)))
    except DroverError as exc:
        print(f"error: {exc.code().name}: {exc.details()}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
