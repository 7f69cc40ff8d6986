"""The API server's clock, as this process reads it from the ``Date`` of its answers.

Ages that replicas compare (a charge's, a reservation's, a statement's
lease, a Terminating pod's grace period against the ``deletionTimestamp``
kube-apiserver wrote) must be measured on one clock: replicas' wall clocks
differ (skew, an NTP step), and a replica ahead by more than the release
window would free another's charges and reservations while they still stand.
So every time is the API server's: each answer's ``Date`` (whole seconds,
RFC 9110) was stamped at some moment between the request being sent and its
answer read, which bounds this process's offset from the API server:

    Date - received  <  offset  <  Date + 1 - sent

The bounds of every answer are intersected, so the offset is known to well
within a second after a few answers that straddle the turn of a second; an
answer whose bounds do not meet the others' (a clock stepped, here or
there) starts the estimate anew. Until an answer has come, the offset is 0.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from email.utils import parsedate_to_datetime


class ServerClock:
    """This process's estimate of the API server's clock (unix seconds)."""

    def __init__(self, local: Callable[[], float] = time.time) -> None:
        self.local = local
        self._low, self._high = float("-inf"), float("inf")
        self._date = ("", 0.0)  # the last Date read, and what it says (most answers of a second share one)

    @property
    def offset(self) -> float:
        """The API server's clock less this process's (0 until an answer came)."""
        if self._high == float("inf"):
            return 0.0
        return (self._low + self._high) / 2

    def now(self) -> float:
        return self.local() + self.offset

    def sample(self, sent: float, received: float, date: str) -> None:
        """An answer sent at local ``sent``, read at local ``received``, dated ``date`` (an HTTP date)."""
        if date != self._date[0]:
            try:
                stamp = parsedate_to_datetime(date).timestamp()
            except (TypeError, ValueError, IndexError):
                return
            self._date = (date, stamp)
        stamp = self._date[1]
        low, high = stamp - received, stamp + 1 - sent
        if low >= self._high or high <= self._low:  # a clock stepped: what was known no longer holds
            self._low, self._high = low, high
        else:
            self._low, self._high = max(self._low, low), min(self._high, high)
