"""The per-node agent: discovers GPUs and NICs, streams telemetry to the
control plane, runs the job's worker processes (`supervisor`) and hands them
new plans. `runtime/` is the torch side that runs inside each worker."""
