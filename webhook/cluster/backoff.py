"""How long to wait before talking to a failing API server again."""

from __future__ import annotations

import random
from dataclasses import dataclass

_MAX_EXPONENT = 64  # past this the cap applies anyway; avoids float overflow


@dataclass(frozen=True)
class Backoff:
    """Capped exponential backoff with jitter.

    The n-th consecutive failure waits ``min(cap, initial * factor**n)``,
    shortened by up to ``jitter`` of itself at random so that many replicas
    that lost the API server together do not come back in lockstep.
    """

    initial: float = 0.5
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.5

    def delay(self, attempt: int, rng: random.Random) -> float:
        base = min(self.cap, self.initial * self.factor ** min(attempt, _MAX_EXPONENT))
        return base * (1.0 - self.jitter * rng.random())
