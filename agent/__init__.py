"""The per-node agent: discovers GPUs and NICs, streams telemetry, runs the
job's workers and applies new plans. Built by the runtime and control-plane
issues; the planner foundation does not use it yet."""
