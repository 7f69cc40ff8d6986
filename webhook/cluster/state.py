"""What the index knows about how well it knows one resource."""

from __future__ import annotations

from dataclasses import dataclass

from webhook.view.protocol import KNOWN, Availability, Resource


@dataclass(frozen=True)
class ResourceState:
    """Health of one watched resource. Immutable: the watch thread swaps in new ones.

    Times are ``time.monotonic()`` seconds (or whatever clock the index was given).
    """

    watched: bool = True
    synced: bool = False  # a first complete list has been stored
    last_event: float | None = None  # last list page, watch event or bookmark received
    last_success: float | None = None  # last sign of being current: list, watch start/event/end
    relists: int = 0  # complete lists after the first (410 Gone, failures)
    watch_errors: int = 0  # failed list or watch requests, dropped streams, ERROR events
    error: str = ""  # what fails right now, e.g. "watch failing (HTTP 500)"; "" when healthy

    def availability(self, resource: Resource, now: float, stale_after: float) -> Availability:
        """Known, or why not: never synced, or failing for longer than ``stale_after``."""
        if not self.watched:
            return Availability(False, f"{resource} not watched (no loaded policy needs them)")
        if not self.synced:
            detail = f": {self.error}" if self.error else ""
            return Availability(False, f"{resource} not synced yet{detail}")
        age = self.age(now)
        if self.error and age is not None and age > stale_after:
            return Availability(False, f"{resource} stale for {age:.0f}s: {self.error}")
        return KNOWN

    def age(self, now: float) -> float | None:
        """Seconds since the last success, None before the first."""
        return None if self.last_success is None else max(0.0, now - self.last_success)
