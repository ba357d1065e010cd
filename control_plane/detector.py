"""Straggler detection from telemetry, calm on a loaded machine.

Each step, a device's ratio is its compute time per block per micro-batch
(its own work: waiting for a partner is not counted), scaled by its GPU's
nominal TFLOP/s and its stage's TP size (the control plane's intake does
this, so a healthy GPU of a slower kind or a larger share of a block reads
1.0), over that step's reference, the lower median over the job's devices. Comparing within a step
cancels what slows every device alike (a busy host, a noisy neighbour);
FALCON compares with the median too, and the lower median keeps a slow half
of a small job from dragging the reference up.

A device's rate is judged over its last `window` steps, with hysteresis:
- it becomes slow only when all but one of the window's ratios reach
  `healthy_below` (1.2, as in Malleus): one spike, or two on a long window's
  edge, is noise, not a straggler;
- once slow it stays slow until the window's median falls below
  `recovered_below`, so a rate near the threshold does not flap;
- its rate is the window's median, rounded to 0.1.
Healthy devices read 1.0. Slow links show as point-to-point waits far above
the median while compute stays normal.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from dataclasses import dataclass, field, fields

from drover.planner.cluster import MAX_RATE


@dataclass(frozen=True)
class DetectorSettings:
    """Malleus's values as defaults; `drover server` flags and DROVER_* variables set them."""

    window: int = field(default=4, metadata={"help": "Steps a device is judged over."})
    healthy_below: float = field(
        default=1.2,
        metadata={
            "help": "A device becomes a straggler when all but one step of its window are this much slower "
            "than the job's lower median."
        },
    )
    recovered_below: float = field(
        default=1.1, metadata={"help": "A straggler is healthy again when its window's median falls below this."}
    )
    replan_delta: float = field(
        default=0.3,
        metadata={"help": "A rate must move this far from what the current plan assumed to consider a new plan."},
    )
    cooldown_steps: int = field(default=4, metadata={"help": "Steps a new plan runs before it is judged."})
    min_gain: float = field(
        default=0.05,
        metadata={"help": "A new plan must predict a step at least this fraction faster (and repay its migration)."},
    )
    slow_link_factor: float = field(
        default=3.0, metadata={"help": "Point-to-point waits this many times the median mark a slow link."}
    )
    link_delta: float = field(
        default=0.2,
        metadata={
            "help": "A NIC's measured bandwidth must move this fraction from what the current plan assumed "
            "to consider a new plan."
        },
    )

    def __post_init__(self):
        checks = [
            ("window", self.window >= 2, "an integer >= 2"),
            ("healthy_below", self.healthy_below > 1.0, "a number > 1"),
            (
                "recovered_below",
                1.0 <= self.recovered_below <= self.healthy_below,
                f"a number in [1, healthy_below = {self.healthy_below}]",
            ),
            ("replan_delta", self.replan_delta > 0, "a number > 0"),
            ("cooldown_steps", self.cooldown_steps >= 0, "an integer >= 0"),
            ("min_gain", 0 <= self.min_gain < 1, "a number in [0, 1)"),
            ("slow_link_factor", self.slow_link_factor > 1, "a number > 1"),
            ("link_delta", 0 < self.link_delta < 1, "a number in (0, 1)"),
        ]
        for name, ok, allowed in checks:
            if not ok:
                raise ValueError(f"detector setting {name} = {getattr(self, name)!r}: {allowed}")


SETTINGS = fields(DetectorSettings)


class Detector:
    def __init__(self, settings: DetectorSettings = DetectorSettings()):
        self.settings = settings
        self._by_step: dict[int, dict[str, float]] = defaultdict(dict)  # step -> device -> compute
        self._steps: dict[str, deque] = {}  # device -> its last (step, p2p wait, gradient sync) samples
        self._slow: set[str] = set()  # devices judged slow (the hysteresis state)
        self._baseline: dict[str, float] = {}  # device -> its lowest windowed communication time in this plan

    def observe(
        self, device: str, step: int, compute_s_per_block: float, p2p_wait_s: float, grad_sync_s: float = 0.0
    ) -> None:
        steps = self._steps.setdefault(device, deque(maxlen=self.settings.window))
        if steps and step <= steps[-1][0]:
            return  # a resent sample after a reconnect
        steps.append((step, p2p_wait_s, grad_sync_s))
        self._by_step[step][device] = compute_s_per_block
        for old in [s for s in self._by_step if s < step - 4 * self.settings.window]:
            del self._by_step[old]  # bounded even when a device falls silent

    def forget(self, device: str) -> None:
        """Drop a device's window: it has no work in the plan, so nothing to judge."""
        self._steps.pop(device, None)
        self._slow.discard(device)
        self._baseline.pop(device, None)

    def discard_before(self, step: int) -> None:
        """Judge only steps from `step` on (a new plan changes every device's work); the
        hysteresis state is kept, so a known straggler is not re-announced."""
        for old in [s for s in self._by_step if s < step]:
            del self._by_step[old]
        for device, samples in self._steps.items():
            self._steps[device] = deque((s for s in samples if s[0] >= step), maxlen=self.settings.window)
        self._baseline.clear()  # a new plan communicates differently

    def rates(self) -> dict[str, float]:
        """Straggling rate per device with a full window of compared steps; healthy ones are 1.0."""
        references = {
            step: statistics.median_low(peers.values()) for step, peers in self._by_step.items() if len(peers) >= 2
        }
        rates = {}
        for device, steps in self._steps.items():
            ratios = [
                self._by_step[s][device] / references[s] if references[s] > 0 else 1.0
                for s, *_ in steps
                if s in references
            ]
            if len(ratios) < self.settings.window:
                continue
            median = statistics.median(ratios)
            if device in self._slow:
                if median < self.settings.recovered_below:
                    self._slow.discard(device)
            elif sorted(ratios)[1] >= self.settings.healthy_below:  # all but one step slow
                self._slow.add(device)
            rates[device] = min(MAX_RATE, max(1.0, round(median, 1))) if device in self._slow else 1.0
        return rates

    def slow_links(self, rates: dict[str, float]) -> list[str]:
        """Devices whose communication stands out while their compute does not (`rates`: this
        detector's rates(), already computed): point-to-point waits far above the job's median,
        or waits and gradient syncs together far above the device's own best under this plan
        (a link that became slow)."""
        full = {d: v for d, v in self._steps.items() if len(v) == self.settings.window}
        factor = self.settings.slow_link_factor
        risen = set()
        # A device computing slowly, known or still being judged, makes its partners wait: no
        # link to blame for their rise.
        recent = [self._by_step[s] for s in sorted(self._by_step)[-self.settings.window :]]
        straggling = any(r > 1.0 for r in rates.values()) or any(
            c >= self.settings.healthy_below * statistics.median_low(peers.values())
            for peers in recent
            if len(peers) >= 2
            for c in peers.values()
        )
        for d, v in full.items():
            comm = statistics.median(p + g for _, p, g in v)
            best = self._baseline.setdefault(d, comm)
            if best > 0 and comm > factor * best and not straggling:
                risen.add(d)
            self._baseline[d] = min(best, comm)
        waits = {d: statistics.median(w for _, w, _ in v) for d, v in full.items()}
        median = statistics.median(waits.values()) if len(waits) >= 2 else 0.0
        return sorted(
            d
            for d, w in waits.items()
            if ((median > 0 and w > factor * median) or d in risen) and rates.get(d, 1.0) == 1.0
        )
