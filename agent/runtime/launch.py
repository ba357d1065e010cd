"""Run training: N local worker processes following plans, or the
single-process reference that every parallel run must match."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from contextlib import nullcontext
from multiprocessing import connection
from pathlib import Path

import torch

from drover.planner.cluster import Cluster, Device, Gpu, Node
from drover.planner.cost import validate
from drover.planner.errors import PlanError, SpecError
from drover.planner.model import ModelSpec
from drover.planner.plan import Plan
from drover.planner.ports import free_port
from drover.planner.training import Evaluation, Training, lr_at

from .checkpoint import model_meta
from .handoff import WorkerArgs, pace, start_worker, worker_context
from .inputs import open_inputs
from .links import Namespaces
from .model import EMBED, HEAD, Decoder, config_of, loss_sum
from .optim import AdamW, clip_factor, local_sq_norm

LOCAL_NODE = "local"


def local_cluster(workers: int) -> Cluster:
    """This machine as a cluster of `workers` devices `local/0..N-1`; memory is not what limits a CPU run."""
    gpu = Gpu("cpu", tflops=1.0, memory_gib=1e9)
    return Cluster(LOCAL_NODE, (Node(LOCAL_NODE, workers, gpu, intra_gbps=100.0, ethernet_gbps=100.0),))


def pace_of(cluster: Cluster, device: Device, spec: ModelSpec) -> float:
    return pace(cluster.nodes[device.node].gpu.tflops, spec)


# What a run writes in its out dir: an earlier run's, in a reused one, would be read as this
# run's (its validation loss, its devices' telemetry) or appended to.
RUN_FILES = ("trace.jsonl", "migrations.jsonl", "eval.jsonl", "model.pt", "model.json")


def fresh_out(out: Path) -> Path:
    """`out` with no earlier run's files in it, and its telemetry folder."""
    out.mkdir(parents=True, exist_ok=True)
    for name in RUN_FILES:
        (out / name).unlink(missing_ok=True)
    telemetry = out / "telemetry"
    for old in telemetry.iterdir() if telemetry.is_dir() else ():
        if old.is_file():
            old.unlink()
    telemetry.mkdir(exist_ok=True)
    return out


def check_precision(spec: ModelSpec, training: Training) -> None:
    """bf16 where it can run, before any worker starts: each worker refused it on a CPU, in a
    traceback of its own (the reference trained in fp32 without a word)."""
    if training.precision == "bf16" and not torch.cuda.is_available():
        raise SpecError(spec.name, "precision", "bf16", "fp32 on CPU devices (bf16 runs on CUDA)")


def train_workers(
    spec: ModelSpec,
    workers: int,
    plans: list[tuple[int, Plan]],
    out_dir: str | Path,
    training: Training,
    slow: dict[str, tuple[float, int]] | None = None,
    data_root: str | Path = ".",
    tick: Callable[[], None] | None = None,
    paced: Cluster | None = None,
    namespaces: Namespaces | None = None,
) -> None:
    """Train with `workers` processes; plans[0] starts at the first step (0, or the resumed
    checkpoint's), the others arrive at their steps. The job's inputs are opened here first,
    so a bad one fails before any worker starts. `tick` is called twice a second meanwhile.

    paced: an emulated cluster, one worker per device (its ids, in order). Each takes the
    time its GPU would (pace_of), slower by the device's rate in the cluster or in `slow`.
    namespaces: each worker runs in its node's namespace of an emulated network."""
    cluster = paced or local_cluster(workers)
    if len(cluster.devices) != workers:
        raise PlanError("workers", f"{workers} workers for the {len(cluster.devices)} devices of {cluster.name}")
    for _, plan in plans:
        validate(plan, cluster, spec)  # refused before any worker starts, naming the rule it breaks
    late = [step for step, _ in plans[1:] if step >= training.steps]
    if late:  # it was ignored without a word
        raise PlanError("switch", f"a switch at step {late[0]}: the run's steps are 0 to {training.steps - 1}")
    open_inputs(spec, training, data_root)
    check_precision(spec, training)
    rated = {d: (r, 0) for d, r in cluster.rates.items() if 1.0 < r < float("inf")} if paced else {}
    slow = rated | (slow or {})
    unknown = [d for d in slow if d not in cluster.device_by_id]
    if unknown:
        ids = [d.id for d in cluster.devices]
        raise PlanError("unknown-device", f"--slow names {unknown[0]!r}; devices are {ids[0]}..{ids[-1]}")
    out = fresh_out(Path(out_dir))  # only once everything is checked: a refused run writes nothing
    ranks = {d.id: i for i, d in enumerate(cluster.devices)}
    host = namespaces.master_host if namespaces else "127.0.0.1"
    init = f"tcp://{host}:{free_port()}"
    ctx = worker_context()
    procs = []
    for device in cluster.devices:
        rank = ranks[device.id]
        args = WorkerArgs(
            rank,
            workers,
            init,
            spec,
            training,
            plans,
            str(out),
            str(data_root),
            slow.get(device.id),
            pace_of(cluster, device, spec) if paced else 0.0,
            namespaces.of_node[device.id.split("/")[0]] if namespaces else "",
            namespaces.env if namespaces else None,
            ranks=ranks,
        )
        procs.append(start_worker(ctx, args, f"drover-worker-{rank}"))
    wait_all(procs, tick)


def wait_all(procs, tick: Callable[[], None] | None = None) -> None:
    """Join workers, calling `tick` twice a second; on the first failure stop the rest (they
    would wait on it) and raise."""
    running = list(procs)
    try:
        while running:
            connection.wait([p.sentinel for p in running], timeout=0.5 if tick else None)
            if tick:
                tick()
            for proc in [p for p in running if not p.is_alive()]:
                running.remove(proc)
                if proc.exitcode != 0:
                    raise RuntimeError(f"worker {proc.name} failed (exit code {proc.exitcode}); stopped the others")
    finally:  # a failed worker, or this process told to stop (SIGTERM): none is left running
        for other in running:
            other.terminate()
        for other in running:
            other.join()


def reference_eval(model, val, evaluation: Evaluation, spec: ModelSpec, done: int) -> dict:
    """The validation loss the workers write to eval.jsonl: the first `samples` windows of the
    val split in whole global batches, batch i read as step i."""
    batches = evaluation.batches(spec.global_batch)
    total = 0.0
    with torch.no_grad():
        for i in range(batches):
            inputs_, targets = val.batch(i, 0, spec.global_batch)
            total += (loss_sum(model(inputs_), targets) / spec.global_batch).item()
    return {"step": done, "val_loss": total / batches, "samples": batches * spec.global_batch}


def train_reference(spec: ModelSpec, training: Training, out_dir: str | Path, data_root: str | Path = ".") -> None:
    """One process, the whole batch at once: what every parallel run must equal
    (the same data, starting weights, clipping by the global norm and schedule)."""
    optim, steps = AdamW.of(training.optimizer), training.steps
    inputs = open_inputs(spec, training, data_root)
    if inputs.resume:
        raise PlanError("resume", "the reference trains from the start; resume runs on workers")
    check_precision(spec, training)  # it would train in fp32 and say nothing
    out = fresh_out(Path(out_dir))
    cfg = config_of(spec)
    model = Decoder(cfg, training.seed)
    if inputs.init:
        for part in [EMBED, *range(spec.layers), HEAD]:
            target = model.embed if part == EMBED else model.head if part == HEAD else model.blocks[part]
            target.load_state_dict(inputs.init.part(part))
    state = {n: AdamW.new_state(p) for n, p in model.named_parameters()}
    evaluation = training.eval
    with (
        open(out / "trace.jsonl", "w") as trace,
        open(out / "eval.jsonl", "w") if evaluation else nullcontext() as evals,
    ):
        for step in range(steps):
            started = time.perf_counter()
            inputs_, targets = inputs.train.batch(step, 0, spec.global_batch)
            loss = loss_sum(model(inputs_), targets) / spec.global_batch
            loss.backward()
            grad_norm = None
            if optim.clip_norm is not None:
                sq = local_sq_norm([p.grad for p in model.parameters()], torch.device("cpu")).item()
                grad_norm, factor = sq**0.5, clip_factor(sq, optim.clip_norm)
                if factor < 1.0:
                    for p in model.parameters():
                        p.grad.mul_(factor)
            lr = lr_at(optim, training.schedule, step, steps)
            for name, p in model.named_parameters():
                optim.update(p.data, p.grad, state[name], step + 1, lr)
                p.grad = None
            elapsed = time.perf_counter() - started
            trace.write(
                json.dumps(
                    {
                        "step": step,
                        "loss": loss.item(),
                        "plan_version": 0,
                        "lr": lr,
                        "step_time_s": elapsed,
                        "samples_per_s": spec.global_batch / elapsed,
                    }
                    | ({"grad_norm": grad_norm} if grad_norm is not None else {})
                )
                + "\n"
            )
            done = step + 1
            if evaluation and (done % evaluation.every_steps == 0 or done == steps):
                evals.write(json.dumps(reference_eval(model, inputs.val, evaluation, spec, done)) + "\n")
    (out / "migrations.jsonl").write_text("")
    torch.save(model.state_dict(), out / "model.pt")
    (out / "model.json").write_text(json.dumps(model_meta(spec)))
