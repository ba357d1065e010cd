"""Straggler detection from telemetry (defaults after Malleus).

A device's straggling rate is its median compute time per block per
micro-batch over the last `window` steps (its own work: time waiting for a
tensor-parallel partner is not counted), against the healthy reference: the
median over the job's devices (FALCON compares with the median too). Rates below `healthy_below` count as 1.0. A replan is
worth considering only when some device's rate moved by `replan_delta` or
more from the rates the current plan was made for. Slow links show as
point-to-point waits far above the median while compute stays normal.
"""

from __future__ import annotations

import statistics
from collections import defaultdict, deque
from dataclasses import dataclass


@dataclass(frozen=True)
class DetectorConfig:
    window: int = 3
    healthy_below: float = 1.2
    replan_delta: float = 0.3
    slow_link_factor: float = 3.0


class Detector:
    def __init__(self, config: DetectorConfig = DetectorConfig()):
        self.config = config
        self._compute: dict[str, deque] = defaultdict(lambda: deque(maxlen=config.window))
        self._waits: dict[str, deque] = defaultdict(lambda: deque(maxlen=config.window))
        self._last_step: dict[str, int] = {}

    def observe(self, device: str, step: int, compute_s_per_block: float, p2p_wait_s: float) -> None:
        if step <= self._last_step.get(device, -1):
            return  # a resent sample after a reconnect
        self._last_step[device] = step
        self._compute[device].append(compute_s_per_block)
        self._waits[device].append(p2p_wait_s)

    def forget(self, device: str) -> None:
        """Drop a device's window: it has no work in the plan, so nothing to judge."""
        self._compute.pop(device, None)
        self._waits.pop(device, None)

    def rates(self) -> dict[str, float]:
        """Straggling rate per device with a full window; healthy ones are 1.0."""
        full = {d: statistics.median(v) for d, v in self._compute.items() if len(v) == self.config.window}
        if len(full) < 2:
            return {}
        reference = statistics.median(full.values())
        rates = {}
        for device, mean in full.items():
            rate = mean / reference if reference > 0 else 1.0
            rates[device] = round(rate, 2) if rate >= self.config.healthy_below else 1.0
        return rates

    def slow_links(self) -> list[str]:
        """Devices whose point-to-point waits stand out while their compute does not."""
        waits = {d: statistics.fmean(v) for d, v in self._waits.items() if len(v) == self.config.window}
        if len(waits) < 2:
            return []
        median = statistics.median(waits.values())
        rates = self.rates()
        return sorted(d for d, w in waits.items()
                      if median > 0 and w > self.config.slow_link_factor * median and rates.get(d, 1.0) == 1.0)

    def moved(self, planned: dict[str, float], current: dict[str, float]) -> dict[str, float]:
        """Devices whose rate moved by replan_delta or more from what the plan assumed."""
        return {d: r for d, r in current.items() if abs(r - planned.get(d, 1.0)) >= self.config.replan_delta}
