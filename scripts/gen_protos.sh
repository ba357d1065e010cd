#!/usr/bin/env bash
# Regenerates protos/drover/v1/*_pb2*.py from the .proto files with the
# pinned generator (grpcio-tools in pyproject.toml's dev extra). The
# generated code is committed; tests/test_protos.py regenerates and diffs.
set -euo pipefail
cd "$(dirname "$0")/.."
OUT="${1:-protos}"
python -m grpc_tools.protoc -Iprotos --python_out="$OUT" --pyi_out="$OUT" --grpc_python_out="$OUT" \
    protos/drover/v1/state.proto protos/drover/v1/plan.proto protos/drover/v1/jobspec.proto protos/drover/v1/events.proto protos/drover/v1/agent.proto protos/drover/v1/jobs.proto
