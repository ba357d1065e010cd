"""A short prepared check for a machine with one CUDA GPU: a few steps of a
small Llama in bf16 on the GPU (one worker, NCCL) against the fp32 CPU
single-process reference. bf16 rounds every matmul, so the comparison is
within a stated tolerance, not exact: per-step losses within 2% relative and
every parameter tensor within 5% relative (in norm) after the last step.
Prints JSON; exits 1 if a bound is broken or no GPU is present.

    bash scripts/gpu_smoke.sh
"""

from __future__ import annotations

import json
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

import torch

from drover.agent.runtime.launch import local_cluster, train_reference, train_workers
from drover.planner.model import load_model
from drover.planner.search import make_plan
from drover.planner.training import Training

ROOT = Path(__file__).resolve().parents[1]
STEPS, LOSS_RTOL, PARAM_RTOL = 5, 2e-2, 5e-2


def main() -> int:
    if not torch.cuda.is_available():
        print(json.dumps({"ok": False, "reason": "no CUDA device"}))
        return 1
    spec = load_model(ROOT / "examples" / "models" / "tiny-llama.yaml")
    training = Training(STEPS, 0)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        train_reference(spec, training, tmp / "cpu")  # the reference never leaves the CPU
        plan = make_plan(local_cluster(1), spec, "drover")
        train_workers(spec, 1, [(0, plan)], tmp / "gpu", replace(training, precision="bf16"))
        losses = {
            name: [json.loads(line)["loss"] for line in (tmp / name / "trace.jsonl").read_text().splitlines()]
            for name in ("cpu", "gpu")
        }
        want, got = torch.load(tmp / "cpu" / "model.pt"), torch.load(tmp / "gpu" / "model.pt")
    loss_rel = max(abs(g - w) / abs(w) for w, g in zip(losses["cpu"], losses["gpu"]))
    param_rel = max(((got[k].float() - want[k]).norm() / want[k].norm()).item() for k in want)
    ok = loss_rel <= LOSS_RTOL and param_rel <= PARAM_RTOL and all(v.dtype == torch.float32 for v in got.values())
    report = {
        "ok": ok,
        "device": torch.cuda.get_device_name(0),
        "steps": STEPS,
        "losses": losses,
        "max_loss_rel": loss_rel,
        "loss_rtol": LOSS_RTOL,
        "max_param_rel": param_rel,
        "param_rtol": PARAM_RTOL,
        "master_weights": "float32",
    }
    print(json.dumps(report, indent=1))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
