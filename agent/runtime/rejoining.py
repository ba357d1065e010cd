"""Surviving lost peers inside a worker: leave the broken world, join the next one the inbox
names, agree on the step (the step commit protocol, recovery.py) and take the new plan's
parts from replicas or the newest checkpoint. A mixin of worker.Worker, whose state it
shares."""

from __future__ import annotations

import datetime
import gc
import json
import logging
import time
from pathlib import Path

import torch
import torch.distributed as dist

from . import layout
from .checkpoint import complete_checkpoints, find_checkpoint
from .checkpoint import read_meta as read_checkpoint_meta
from .recovery import COLLECTIVE_TIMEOUT_S, World, close_connections, peer_lost, rendezvous_store, wait_for_world

log = logging.getLogger("drover.worker")


class LeftOut(Exception):
    """The new world has no place for this device: it leaves the job."""


class Rejoining:
    def _recover(self, planned: bool = False) -> None:
        """Leave the world (broken, or `planned`: the job grows), join the next one the inbox
        names, and continue there."""
        lost_at = time.perf_counter()
        self.watch.leave()
        self._leave_world()
        stalled = Path(self.args.inbox) / f"stalled-{self.device_id.replace('/', '_')}.json"
        if not planned:
            stalled.write_text(json.dumps({"generation": self.generation}))  # the agent reports it
        while True:
            world = wait_for_world(Path(self.args.inbox), self.generation, COLLECTIVE_TIMEOUT_S)
            self.generation = world.generation
            if self.device_id not in world.ranks:
                raise LeftOut(f"{self.device_id} has no place in world {world.generation}")
            self.watch.enter(world.generation, world.ranks)  # from here on its connections are its own
            try:
                dist.init_process_group(
                    "nccl" if self.torch_device.type == "cuda" else "gloo",
                    store=rendezvous_store(
                        world.init_method, world.ranks[self.device_id], world.size, COLLECTIVE_TIMEOUT_S
                    ),
                    rank=world.ranks[self.device_id],
                    world_size=world.size,
                    timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
                )
                record = self._rejoin(world, lost_at)
                stalled.unlink(missing_ok=True)
                if self.rank == 0:
                    self._output("migrations.jsonl").write(json.dumps(record) + "\n")
                    self._output("migrations.jsonl").flush()
                return
            except RuntimeError as exc:  # lost another peer while regrouping: the next world
                if not peer_lost(exc):
                    raise
            self._leave_world()

    def _leave_world(self) -> None:
        """Close every group and shut the world's connections, so that peers still waiting on
        this worker fail fast too."""
        self.groups, self.tp_pg, self.sync_pgs, self.p2p_pgs = {}, None, [], {}
        # TP hooks hold their group: those of the blocks held now, and in the middle of a switch
        # those of the blocks of the plan before it (kept to go back to), given away or not.
        held = list(self.parts.values()) + (list(self.previous[2].values()) if self.previous else [])
        for module in held:
            if hasattr(module, "enter"):
                module.enter, module.exit = torch.nn.Identity(), torch.nn.Identity()
        try:
            dist.destroy_process_group()
        except Exception:  # noqa: BLE001 - a broken group may fail to close; it is gone either way
            pass
        gc.collect()  # the groups' sockets close when the last reference goes
        # and whatever still holds one (a pending work, a frame) must not keep a peer blocked on
        # this worker until the collective timeout: its sockets are shut all the same.
        closed = close_connections()
        log.info(
            "%s left world %d (shut %d connections still open: %s)",
            *(self.device_id, self.generation, len(closed), ", ".join(closed[:16])),
        )

    def _rejoin(self, world: World, lost_at: float) -> dict:
        """Agree on the step, take the new plan's parts, and return the recovery's record."""
        old_ranks = self.ranks
        self.rank, self.ranks, self.world = world.ranks[self.device_id], world.ranks, world.size
        # The step commit protocol: agree on the newest committed step, roll forward if behind.
        newest = torch.tensor([self.committed], dtype=torch.int64, device=self.torch_device)
        self.watch.wait(dist.all_reduce(newest, op=dist.ReduceOp.MAX, async_op=True))
        newest = int(newest)
        if self.joining:  # a newcomer holds nothing yet: it starts where the others are
            self.committed, self.joining = newest, False
        elif newest == self.committed + 1 and self.pending == self.committed:
            self._update(self.committed)
            self.committed = newest
        elif newest != self.committed:
            raise RuntimeError(f"{self.device_id} is at step {self.committed}, the world at {newest}: cannot recover")
        elif self.previous is not None:
            # Nobody committed this step, so a switch begun in it may have finished on some workers
            # and not on others: all go back to what they held before it, unchanged since.
            self.plan, self.version, self.parts, self.state, self.roles, self.norm_parts = self.previous
        self.pending, self.previous = None, None
        for module in self.parts.values():
            for p in module.parameters():
                p.grad = None
        # What is held now: the plan before an uncommitted switch, where it went back to above
        # (the holdings of the plan switched to named parts nobody held: KeyError in the moves).
        before = layout.surviving_holdings(self.plan, old_ranks, world.ranks, self.spec.layers)
        lost = layout.lost_parts(before)
        self.received[world.plan_version] = world.plan
        if not lost:
            record = self._switch(world.plan_version, self.committed, before=before, started=lost_at)
            if set(old_ranks) <= set(world.ranks):  # nobody lost: the job grew
                return record | {"joined": sorted(set(world.ranks) - set(old_ranks))}
            return record | {"recovered_from": "replicas", "steps_redone": 0}
        if not self.inputs.checkpoints or not complete_checkpoints(self.inputs.checkpoints):
            raise RuntimeError(f"parts {lost[:5]} were lost with every copy, and the job has no checkpoint")
        checkpoint = find_checkpoint(self.inputs.checkpoints)
        saved_at = read_checkpoint_meta(checkpoint)["step"]  # its files checked before DCP reads them
        self.parts, self.state = {}, {}  # every worker rolls back to the same step
        record = self._switch(world.plan_version, self.committed, before=None, fill_from=checkpoint, started=lost_at)
        redone = self.committed - saved_at
        self.committed -= redone
        self.curves.close()  # reopened at the step now redone, which purges what was logged from it on
        return record | {"step": self.committed, "recovered_from": "checkpoint", "steps_redone": redone}
