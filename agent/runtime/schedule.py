"""One step of one pipeline stage: its micro-batches, one-forward-one-backward.

1F1B keeps at most S-k micro-batches' activations alive on stage k of S: a
warm-up of S-k-1 forwards, then a forward and a backward in turn, then the
remaining backwards. Activations go forward and their gradients back point to
point, tagged 2*mb and 2*mb+1 by global micro-batch index, so every pair of
stages agrees on what each message is without talking. Each micro-batch's
loss is its samples' summed cross-entropy divided by the global batch, so
the gradients add up to those of the whole batch, whatever the plan.

Also the telemetry of the step (Stats): the worker's own compute apart from
waiting on neighbours or a TP partner, which is what the control plane's
detector compares across devices.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

from drover.planner.model import ModelSpec

from . import layout
from .model import loss_sum
from .tensor_parallel import WaitClock


@dataclass
class Stats:
    """Telemetry of one step on one worker."""

    loss: float = 0.0
    compute_s: float = 0.0
    p2p_wait_s: float = 0.0
    tp_wait_s: float = 0.0
    sync_s: float = 0.0
    blocks: float = 0.0  # blocks' worth of work, the head included
    micro_batches: int = 0
    bytes_sent: dict = field(default_factory=lambda: defaultdict(int))
    bytes_recv: dict = field(default_factory=lambda: defaultdict(int))

    def to_dict(self, step: int, version: int) -> dict:
        per_piece = self.compute_s / (self.blocks * self.micro_batches) if self.blocks and self.micro_batches else None
        return {
            "step": step,
            "plan_version": version,
            "compute_s": self.compute_s,
            "compute_s_per_block": per_piece,
            "p2p_wait_s": self.p2p_wait_s,
            "tp_wait_s": self.tp_wait_s,
            "grad_sync_s": self.sync_s,
            "bytes_sent": dict(self.bytes_sent),
            "bytes_recv": dict(self.bytes_recv),
        }


def run_stage(
    role: layout.Role,
    parts: dict[layout.Part, torch.nn.Module],
    spec: ModelSpec,
    source,
    step: int,
    device: torch.device,
    tp_clock: WaitClock,
    slow: tuple[float, int] | None,
    bf16: bool = False,
    forward_only: bool = False,
    pace: float = 0.0,
    p2p_groups: dict | None = None,
    tp_group=None,
) -> Stats:
    """Forward and backward every micro-batch of the stage, leaving gradients in `parts`;
    `source.batch(step, first_sample, count)` gives the tokens.

    `slow` is an emulated straggler (rate, from step); `tp_clock` times the
    stage's TP all-reduces, so a slow partner's time is not counted as ours,
    and its `wait` waits for each of them and for each send and receive (a
    worker's WorldWatch.wait: given up once its world has lost a member);
    tp_group: the stage's TP process group (None when t = 1).
    pace: a paced device's FLOP/s (tflops x mfu of the GPU it emulates; 0: not
    paced). Each piece of work then takes its FLOPs / (pace / rate), the real
    computation padded by a sleep, so timings follow the emulated cluster.
    p2p_groups: {(rank, rank): process group} for the sends between neighbouring
    stages (made on the network the two share); other pairs use the default group.
    bf16: compute in bfloat16 under autocast (CUDA), parameters staying fp32.
    forward_only: evaluation, no gradients and no backward messages."""
    stats = Stats()
    b = spec.micro_batch
    first_mb, end_mb = role.micro_batches
    m = end_mb - first_mb
    warmup = min(role.num_stages - role.stage - 1, m)
    blocks = [parts[i] for i in range(*role.blocks)]
    saved: dict[int, tuple[torch.Tensor | None, torch.Tensor]] = {}
    sends = []

    t = len(role.group)
    # This rank's share of one micro-batch's forward FLOPs (cost model: backward is twice that).
    forward_flops = ((role.blocks[1] - role.blocks[0]) * spec.block_flops + role.last * spec.head_flops) / t
    rate = slow[0] if slow and step >= slow[1] else 1.0
    paced_s = 0.0  # the emulated device's time for this step's work so far

    def compute(fn, flops: float):
        nonlocal paced_s
        t0, waited = time.perf_counter(), tp_clock.seconds
        result = fn()
        spent = time.perf_counter() - t0 - (tp_clock.seconds - waited)  # own work, not a TP partner's
        if pace:
            # Paced to the step's total so far, not piece by piece: a piece that overran (a late
            # wake-up, a busy host) is made up on the next, so a healthy device on a loaded host
            # still takes its emulated time and a slow one's ratio to it stays its rate.
            paced_s += flops * rate / pace
            time.sleep(max(0.0, paced_s - stats.compute_s - spent))
        elif rate > 1.0:
            time.sleep((rate - 1) * spent)  # emulation only: RATE times slower
        stats.compute_s += time.perf_counter() - t0 - (tp_clock.seconds - waited)
        stats.tp_wait_s += tp_clock.seconds - waited
        return result

    me = dist.get_rank()

    def pair(peer):
        return (p2p_groups or {}).get((min(me, peer), max(me, peer)))

    def pieces(group) -> int:
        # A neighbouring TP group's members each hold the whole activation, so it crosses in
        # min(t, t') pieces, one per sender, and the receivers all-gather them within their
        # node (Megatron's scatter-gather): the link between nodes carries it once, not t times.
        return min(t, len(group))

    def recv(shape, group, tag):
        g = pieces(group)
        src = group[role.tp_rank % g]
        numel = shape[0] * shape[1] * shape[2]
        piece = torch.empty(-(-numel // g), device=device)
        t0 = time.perf_counter()
        tp_clock.wait(dist.irecv(piece, src, group=pair(src), tag=tag), pair(src))
        if g > 1:
            gathered = [torch.empty_like(piece) for _ in range(t)]
            tp_clock.wait(dist.all_gather(gathered, piece, group=tp_group, async_op=True), tp_group)
            # all_gather orders by rank within the group (ascending global rank); member j of the
            # stage holds piece j mod g, so piece i is the one from the member at position i.
            in_group = sorted(role.group)
            buf = torch.cat([gathered[in_group.index(role.group[i])] for i in range(g)])[:numel].view(shape)
        else:
            buf = piece.view(shape)
        stats.p2p_wait_s += time.perf_counter() - t0
        stats.bytes_recv[src] += piece.numel() * piece.element_size()
        return buf

    def send(tensor, group, tag):
        # Receiver j gets piece j mod g from the sender whose TP rank that is.
        g = pieces(group)
        if role.tp_rank >= g:
            return
        flat = tensor.reshape(-1)
        size = -(-flat.numel() // g)
        piece = torch.nn.functional.pad(flat, (0, size * g - flat.numel()))[
            role.tp_rank * size : (role.tp_rank + 1) * size
        ]
        piece = piece.contiguous()
        for j, dst in enumerate(group):
            if j % g == role.tp_rank:
                sends.append((dist.isend(piece, dst, group=pair(dst), tag=tag), pair(dst), piece))
                stats.bytes_sent[dst] += piece.numel() * piece.element_size()

    shape = (b, spec.seq_len, spec.hidden)

    def forward(i: int) -> None:
        mb = first_mb + i
        inputs, targets = (x.to(device) for x in source.batch(step, mb * b, b))
        x_in = None if role.first else recv(shape, role.prev_group, 2 * mb).requires_grad_(not forward_only)

        def run():
            with torch.autocast(device.type, torch.bfloat16, enabled=bf16), torch.set_grad_enabled(not forward_only):
                x = parts[layout.EMBED](inputs) if role.first else x_in
                for block in blocks:
                    x = block(x)
                if role.last:
                    return loss_sum(parts[layout.HEAD](x).float(), targets) / spec.global_batch
                return x.float()

        out = compute(run, forward_flops)
        if not forward_only:
            saved[i] = (x_in, out)
        if role.last:
            stats.loss += out.item() if role.tp_rank == 0 else 0.0
        else:
            send(out.detach(), role.next_group, 2 * mb)

    def backward(i: int) -> None:
        mb = first_mb + i
        x_in, out = saved.pop(i)
        grad = None if role.last else recv(shape, role.next_group, 2 * mb + 1)
        compute(lambda: torch.autograd.backward(out, grad), 2 * forward_flops)
        if not role.first:
            send(x_in.grad, role.prev_group, 2 * mb + 1)

    if forward_only:
        for i in range(m):
            forward(i)
    else:
        for i in range(warmup):
            forward(i)
        for i in range(m - warmup):
            forward(warmup + i)
            backward(i)
        for i in range(m - warmup, m):
            backward(i)
    for handle, group, _ in sends:  # the piece kept alive until sent
        tp_clock.wait(handle, group)
    # Work in block units: the embedding and head count by their FLOP against a block's, so a
    # stage holding the head with one block does not look slow for it.
    stats.blocks = (role.blocks[1] - role.blocks[0]) + role.last * spec.head_flops / spec.block_flops
    stats.micro_batches = m
    return stats
