"""The policy set in force, and its hot reload from the policy directory.

A change is loaded only once the files have stayed the same between two
checks, and only if they are still the same after loading: a file being
rewritten in place (not atomically) is never loaded half-written.
"""

from __future__ import annotations

import hashlib
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


def directory_digest(directory: Path) -> str:
    """A hash of every policy file's name and content (unreadable files count as such)."""
    digest = hashlib.sha256()
    for path in loader.policy_files(directory):
        try:
            content = path.read_bytes()
        except OSError as exc:
            content = f"unreadable: {exc}".encode()
        digest.update(str(path).encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()


@dataclass
class PolicyStore:
    """Holds the last good PolicySet; a bad change is refused and the old set stays."""

    directory: Path
    current: loader.PolicySet = field(init=False)
    #: why the files on disk do not load now ("" when they do)
    last_error: str = field(init=False, default="")
    #: kinds the policy set knows (Pod and the workload kinds); metric labels are bounded to them
    known_kinds: frozenset[str] = field(init=False, default=frozenset())
    _stamp: tuple[tuple[str, int, int, int], ...] = field(init=False, default=())
    _pending: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self._stamp = directory_stamp(self.directory)
        self._use(loader.load_enforcing(self.directory))
        _say_skipped(self.directory)

    def _use(self, policy_set: loader.PolicySet) -> None:
        self.current, self.last_error = policy_set, ""
        self.known_kinds = frozenset({"Pod", *(kind for _, kind in policy_set.kinds)})

    def reload_if_changed(self) -> bool | None:
        """True: reloaded; False: the change was refused; None: nothing (yet) to load."""
        stamp = directory_stamp(self.directory)
        if stamp == self._stamp:
            self._pending = ""
            return None
        digest = directory_digest(self.directory)
        if digest != self._pending:
            self._pending = digest  # changed since the last check: wait until it stays put
            return None
        new: loader.PolicySet | None = None
        error = ""
        try:
            new = loader.load_enforcing(self.directory)
        except PolicyError as exc:
            error = str(exc)
        if directory_digest(self.directory) != digest:
            self._pending = ""  # changed while loading: start over
            return None
        self._stamp, self._pending = stamp, ""
        if new is None:
            self.last_error = error
            log.error("policy change refused, keeping the policies in force:\n%s", error)
            return False
        self._use(new)
        log.info("policies reloaded: %d policies (%s)", len(new.policies), new.fingerprint)
        _say_skipped(self.directory)
        return True


def _say_skipped(directory: Path) -> None:
    skipped = loader.skipped_files(directory)
    if skipped:
        log.warning("not read as policies (only .yaml and .yml files are): %s",
                    ", ".join(str(p.relative_to(directory)) for p in skipped))
