"""The policy set in force, and its hot reload from the policy directory."""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path

from webhook.errors import PolicyError
from webhook.policy import loader

log = logging.getLogger(__name__)


def directory_stamp(directory: Path) -> tuple[tuple[str, int, int, int], ...]:
    """What changes when any policy file is added, removed or edited (links followed)."""
    stamps = []
    for path in loader.policy_files(directory):
        try:
            st = os.stat(path)
        except OSError:
            continue
        stamps.append((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


@dataclass
class PolicyStore:
    """Holds the last good PolicySet; a bad change is refused and the old set stays."""

    directory: Path
    current: loader.PolicySet = field(init=False)
    last_error: str = field(init=False, default="")
    _stamp: tuple[tuple[str, int, int, int], ...] = field(init=False, default=())

    def __post_init__(self) -> None:
        self._stamp = directory_stamp(self.directory)
        self.current = loader.load_directory(self.directory)

    def reload_if_changed(self) -> bool | None:
        """True: reloaded; False: the change was refused; None: nothing changed."""
        stamp = directory_stamp(self.directory)
        if stamp == self._stamp:
            return None
        self._stamp = stamp
        try:
            new = loader.load_directory(self.directory)
        except PolicyError as exc:
            self.last_error = str(exc)
            log.error("policy change refused, keeping the policies in force:\n%s", exc)
            return False
        self.current, self.last_error = new, ""
        log.info("policies reloaded: %d policies (%s)", len(new.policies), new.fingerprint)
        return True
