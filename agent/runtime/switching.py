"""Plan switches inside a worker: start a new plan at a step boundary, moving only the parts
that change owner (migration.py), making the new plan's process groups on the networks their
nodes share (links.py). A mixin of worker.Worker, whose state it shares."""

from __future__ import annotations

import datetime
import logging
import os
import signal
import time
from pathlib import Path

import torch
import torch.distributed as dist

from drover.planner.plan import Plan

from . import layout
from .checkpoint import load_checkpoint
from .links import bound_to, interface_for
from .migration import migrate, summarize
from .model import build_part
from .parts import empty_part
from .recovery import COLLECTIVE_TIMEOUT_S
from .tensor_parallel import join_group

log = logging.getLogger("drover.worker")

_HELD = object()  # _switch's default: what the current plan holds


def _die() -> None:
    """Emulation (die-DEVICE.json in the inbox): a device lost in the middle of a switch."""
    os.kill(os.getpid(), signal.SIGKILL)


def _die_with_node() -> None:
    """Emulation (die-DEVICE.json with {"scope": "node"}): the whole node lost in the middle of
    a switch: the worker's process group, which is its agent's (drover up starts each agent in
    a group of its own)."""
    os.killpg(os.getpgid(0), signal.SIGKILL)


class Switching:
    def _switch(
        self, version: int, step: int, before=_HELD, fill_from: Path | None = None, started: float | None = None
    ) -> dict:
        """Start plan `version` at this step; move only the parts that change owner. `before`:
        what every worker holds now (default: the current plan's holdings); `fill_from`: a
        checkpoint that fills every part instead (the job's resume, or a rollback); `started`:
        when the switch began, for its record (a recovery: when the loss was noticed)."""
        started = time.perf_counter() if started is None else started
        if self.previous is None:
            self.previous = (self.plan, self.version, self.parts, self.state, self.roles, self.norm_parts)
        new_plan = self.received[version]
        self.roles = layout.roles(new_plan, self.ranks)
        self.norm_parts = layout.norm_parts(new_plan, self.ranks, self.rank)
        role = self.roles.get(self.rank)
        if before is _HELD:
            before = layout.holdings(self.plan, self.ranks, self.spec.layers) if self.plan else None
        if self.plan is None and self.inputs.resume:
            fill_from = self.inputs.resume
        self.filling = fill_from is not None
        migrated = migrate(
            before,
            new_plan,
            self.ranks,
            self.rank,
            role,
            self.cfg,
            self.parts,
            self.state,
            self._origin,
            self.torch_device,
            self.training.seed,
            fault=self._fault() if not self.die_after_switch else None,
            wait=self.watch.wait,
        )
        self.parts, self.state = migrated.parts, migrated.state
        # Everyone alive and here before groups are made: new_group waits on the rendezvous store,
        # where a lost peer is only noticed at the timeout, while a collective notices at once.
        self.watch.wait(dist.barrier(async_op=True))
        self._build_groups(new_plan)
        if fill_from is not None:
            args = (self.rank, new_plan, self.ranks, self.parts, self.state, self.tp_pg, self.torch_device)
            load_checkpoint(fill_from, *args)
        if role and len(role.group) > 1:
            for part, module in self.parts.items():
                if isinstance(part, int):
                    join_group(module, self.tp_pg, self.tp_clock)
        # A part left on one node, where each part had copies on two nodes or more, comes back
        # only from a checkpoint if that node is lost (after a straggler's replan, say, that
        # ended a job its first plan let survive): one now, of the step about to run, before
        # anything runs on that one node alone. (Parts filled from a checkpoint have one.)
        exposes = (
            self.plan is not None
            and self.training.checkpoint is not None
            and fill_from is None
            and layout.one_node_parts(new_plan, self.spec.layers)
            and not layout.one_node_parts(self.plan, self.spec.layers)
        )
        self.plan, self.version = new_plan, version
        record = summarize(step, version, migrated, started, self.torch_device, self.watch.wait)
        if self.die_after_switch and self.die_at_switch and before is not None:  # a switch, not the start
            self._fault()()
        if exposes and self.checkpointed_at != step:
            log.info("plan v%d keeps parts on one node only: a checkpoint at step %d", version, step)
            self._checkpoint(step)
        return record

    def _fault(self):
        """Emulation (die-DEVICE.json): how this worker dies at its next switch, if it is to."""
        if not self.die_at_switch:
            return None
        return _die_with_node if self.die_at_switch == "node" else _die

    def _origin(self, part: layout.Part) -> torch.nn.Module:
        """A part under the first plan: empty for a checkpoint to fill, from the Hugging Face
        weights, or built from (seed, part)."""
        if self.filling:
            return empty_part(self.cfg, part, 1, 0, torch.device("cpu"), self.training.seed)
        if self.inputs.init:
            return self.inputs.init.module(self.cfg, part)
        return build_part(self.cfg, part, self.training.seed)

    def _build_groups(self, plan: Plan) -> None:
        """Every worker creates every new group, in the same order, as torch.distributed
        requires; a group of ranks seen in an earlier plan is reused, never made twice."""
        self.tp_pg, self.sync_pgs, self.p2p_pgs = None, [], {}
        if self.network:  # neighbouring stages talk on the network they share, not the default group's
            for pair in layout.p2p_pairs(plan, self.ranks):
                pg = self._group(pair)
                if self.rank in pair:
                    self.p2p_pgs[pair] = pg
        for ranks in layout.tp_groups(plan, self.ranks):
            pg = self._group(ranks)
            if self.rank in ranks:
                self.tp_pg = pg
        for group in layout.sync_groups(plan, self.ranks, self.spec.layers):
            pg = self._group(group.ranks)
            if self.rank in group.ranks:
                self.sync_pgs.append((group, pg))

    def _group(self, ranks: tuple[int, ...]):
        """The process group of these ranks, on the network their nodes share (links.py)."""
        key = tuple(sorted(ranks))
        if key not in self.groups:
            nodes = {device.split("/")[0] for device, rank in self.ranks.items() if rank in key}
            with bound_to(interface_for(nodes, self.network)):
                self.groups[key] = dist.new_group(list(key), timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S))
        return self.groups[key]
