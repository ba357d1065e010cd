"""Rate limits on the requests that make the control plane work hard or
change what it does: submissions (a plan each), replans (a plan and a
rollout) and detection switches. A token bucket per caller and RPC: a burst,
then a steady rate; beyond it RESOURCE_EXHAUSTED, naming when to retry.

An agent's stream is paced instead (Pacer): past its rate, its next message
is read later, so gRPC's flow control slows that agent alone and nothing it
sent is refused or lost."""

from __future__ import annotations

import time
from dataclasses import dataclass


class ResourceExhausted(RuntimeError):
    """A limit was reached; the request may be retried later."""


@dataclass
class Bucket:
    burst: float
    per_s: float
    tokens: float
    updated: float

    def take(self, now: float) -> float:
        """0 when a request may go now, else the seconds until it may."""
        self.tokens = min(self.burst, self.tokens + (now - self.updated) * self.per_s)
        self.updated = now
        if self.tokens >= 1:
            self.tokens -= 1
            return 0.0
        return (1 - self.tokens) / self.per_s


# RPC -> (burst, requests per second) for each caller
RATES = {"SubmitJob": (10, 1.0), "Replan": (5, 0.2), "SetDetection": (5, 0.2), "DeleteJob": (20, 2.0)}


class RateLimiter:
    def __init__(self, rates: dict[str, tuple[float, float]] = RATES, clock=time.monotonic):
        self.rates, self.clock = rates, clock
        self.buckets: dict[tuple[str, str], Bucket] = {}

    def check(self, method: str, caller: str) -> None:
        if method not in self.rates:
            return
        now = self.clock()
        burst, per_s = self.rates[method]
        bucket = self.buckets.setdefault((method, caller), Bucket(burst, per_s, burst, now))
        wait = bucket.take(now)
        if wait > 0:
            raise ResourceExhausted(
                f"{method}: at most {self.rates[method][1]:g} a second per caller after a "
                f"burst of {self.rates[method][0]:g}; retry in {wait:.1f} s"
            )


# Telemetry and status messages a node's agent stream brings, per second after a burst (log chunks
# come only as a log reader's window allows).
# An agent sends about one a second, and after an outage its backlog in a few messages of 256
# steps each: well inside. An agent sending more (broken, or hostile) is read at this rate, so it
# cannot take the event loop and the database from the other nodes.
AGENT_MESSAGES = (100, 20.0)


class Pacer:
    """Per caller, how long its next message waits before it is handled (a token bucket)."""

    def __init__(self, burst: float, per_s: float, clock=time.monotonic):
        self.burst, self.per_s, self.clock = burst, per_s, clock
        self.buckets: dict[str, Bucket] = {}

    def wait_s(self, caller: str) -> float:
        """0, and the message is counted, when it may be handled now; else the seconds until it may."""
        now = self.clock()
        bucket = self.buckets.setdefault(caller, Bucket(self.burst, self.per_s, self.burst, now))
        return bucket.take(now)
