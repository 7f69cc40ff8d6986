"""The policy set in force, and its hot reload from the policy directory.

A change is loaded only once the files have stayed the same between two
checks, and only if they are still the same after loading: a file being
rewritten in place (not atomically) is never loaded half-written.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from webhook.errors import PolicyError
from webhook.policy import loader, offload

#: what a compiled output (``policies compile -o DIR``) states about itself
OFFLOAD_RECORD = "offload.json"

log = logging.getLogger(__name__)


def directory_stamp(directory: Path, compiled: Path | None = None) -> tuple[tuple[str, int, int, int], ...]:
    """What changes when any policy file is added, removed or edited (links followed), or the
    compiled output's record (``compiled``)."""
    stamps = []
    for path in _watched(directory, compiled):
        try:
            st = os.stat(path)
        except OSError:
            continue
        stamps.append((str(path), st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(stamps)


def _watched(directory: Path, compiled: Path | None) -> list[Path]:
    files = list(loader.policy_files(directory))
    return [*files, compiled / OFFLOAD_RECORD] if compiled is not None else files


def directory_digest(directory: Path, compiled: Path | None = None) -> str:
    """A hash of every policy file's name and content, and the compiled output's record (unreadable
    or missing files count as such)."""
    digest = hashlib.sha256()
    for path in _watched(directory, compiled):
        try:
            content = path.read_bytes()
        except OSError as exc:
            content = f"unreadable: {exc}".encode()
        digest.update(str(path).encode() + b"\0" + hashlib.sha256(content).digest())
    return digest.hexdigest()


@dataclass(frozen=True)
class Change:
    """A change of the files, read whole once it stayed put: the set to put in force, or why not."""

    stamp: tuple[tuple[str, int, int, int], ...]
    #: None: the change is refused
    policy_set: loader.PolicySet | None
    error: str = ""
    #: files in the directory not read as policies (named in the log)
    skipped: tuple[Path, ...] = ()
    #: ``directory_digest`` of the files read
    digest: str = ""


@dataclass
class PolicyStore:
    """Holds the last good PolicySet; a bad change is refused and the old set stays.

    A reload is two steps so that the server reads no file on its event loop:
    ``read_change`` (the disk: stat, read, parse, validate; in a worker thread)
    and ``use`` (the swap and its log lines: no I/O). One reload at a time.
    """

    directory: Path
    #: a compiled output (``serve --compiled``) whose rule parts kube-apiserver runs: skipped here
    compiled: Path | None = None
    current: loader.PolicySet = field(init=False)
    #: why the files on disk do not load now ("" when they do)
    last_error: str = field(init=False, default="")
    #: kinds the policy set knows (Pod and the workload kinds); metric labels are bounded to them
    known_kinds: frozenset[str] = field(init=False, default=frozenset())
    #: ``directory_digest`` of the files in force: replicas running the same files state the same
    digest: str = field(init=False, default="")
    _stamp: tuple[tuple[str, int, int, int], ...] = field(init=False, default=())
    _pending: str = field(init=False, default="")

    def __post_init__(self) -> None:
        self._stamp = directory_stamp(self.directory, self.compiled)
        self.digest = directory_digest(self.directory, self.compiled)
        self._use(self._completed(loader.load_enforcing(self.directory)))
        _say_skipped(self.directory, loader.skipped_files(self.directory))

    def _completed(self, policy_set: loader.PolicySet) -> loader.PolicySet:
        """The set as it is put in force: less what the compiled output runs (reads its record)."""
        return policy_set if self.compiled is None else _offloaded(policy_set, self.compiled)

    def _use(self, policy_set: loader.PolicySet) -> None:
        self.current, self.last_error = policy_set, ""
        self.known_kinds = frozenset({"Pod", *(kind for _, kind in policy_set.kinds)})

    def read_change(self) -> Change | None:
        """The files' change once it has stayed put, read and validated; None: nothing (yet) to load.
        Blocking (the disk): the server calls it in a worker thread."""
        stamp = directory_stamp(self.directory, self.compiled)
        if stamp == self._stamp:
            self._pending = ""
            return None
        digest = directory_digest(self.directory, self.compiled)
        if digest != self._pending:
            self._pending = digest  # changed since the last check: wait until it stays put
            return None
        new: loader.PolicySet | None = None
        error = ""
        try:
            new = loader.load_enforcing(self.directory)
        except PolicyError as exc:
            error = str(exc)
        if directory_digest(self.directory, self.compiled) != digest:
            self._pending = ""  # changed while loading: start over
            return None
        self._pending = ""
        if new is None:
            return Change(stamp, None, error)
        return Change(stamp, self._completed(new), skipped=tuple(loader.skipped_files(self.directory)), digest=digest)

    def use(self, change: Change) -> bool:
        """Put ``change`` in force, or keep the set in force if it is refused (False); no I/O."""
        self._stamp = change.stamp
        if change.policy_set is None:
            self.last_error = change.error
            log.error("policy change refused, keeping the policies in force:\n%s", change.error)
            return False
        before = {p.metadata.name for p in self.current.policies}
        self._use(change.policy_set)
        self.digest = change.digest
        log.info("policies reloaded: %d policies (%s)", len(change.policy_set.policies), change.policy_set.fingerprint)
        gone = sorted(before - {p.metadata.name for p in change.policy_set.policies})
        if gone:
            # (a file emptied, cut short or deleted takes its policies with it, and loads)
            log.warning("policies no longer in force: %s (not in any policy file now)", ", ".join(gone))
        _say_skipped(self.directory, change.skipped)
        return True


def _say_skipped(directory: Path, skipped: Sequence[Path]) -> None:
    if skipped:
        log.warning("not read as policies (only .yaml and .yml files are): %s",
                    ", ".join(str(p.relative_to(directory)) for p in skipped))


def _offloaded(policy_set: loader.PolicySet, compiled: Path) -> loader.PolicySet:
    """The policy set with the rule parts the compiled output runs left to it: only for the
    policies it was compiled from as they are now (a policy changed since runs whole here, and
    so does every policy when the record is missing or unreadable: nothing is skipped unchecked)."""
    path = compiled / OFFLOAD_RECORD
    if not path.exists():  # (an optional ConfigMap not created: no compiled policies installed)
        log.info("no compiled policies installed (%s absent): the webhook runs every rule whole", path)
        return policy_set
    try:
        stated = json.loads(path.read_text(encoding="utf-8"))
        if not isinstance(stated, dict):
            raise ValueError("not a JSON object")
        found, stale = offload.offload(policy_set, stated)
    except (OSError, ValueError) as exc:
        log.warning("compiled policies: %s unusable (%s): the webhook runs every rule whole", path, exc)
        return policy_set
    for name in stale:
        log.warning("compiled policies: %s was compiled from another version of policy %s, or not at all: "
                    "the webhook runs it whole; compile again (gpu-admission policies compile)", path, name)
    log.info("compiled policies (Kubernetes %s): the webhook leaves %d rule(s) to kube-apiserver, whole or in part",
             stated.get("kubeVersion"), len(found.webhook))
    return loader.offloaded(policy_set, found)
