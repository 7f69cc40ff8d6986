"""What the engine decided: allowed or not, the patch, warnings and findings."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Final, Literal, NamedTuple

from webhook.policy.schema import Mode


@dataclass(frozen=True)
class Finding:
    """One thing a rule found: a violation, a change it would make, or an informational note."""

    policy: str
    rule: str
    mode: Mode
    message: str
    field: str = ""
    #: a note, not a violation: the report result it stands for ("pass", or "skip" when the rule
    #: could check nothing); "" for a violation. A note never denies, warns or counts as an audit finding.
    note: Literal["", "pass", "skip"] = ""

    def text(self) -> str:
        return f"[{self.policy}/{self.rule}] {self.message}"

    @property
    def audited(self) -> bool:
        """An audit-mode violation (what the audit annotation, log line and metric report)."""
        return self.mode == "audit" and not self.note

    @property
    def label(self) -> str:
        """How reports name its kind: the mode, or "note"."""
        return "note" if self.note else self.mode


class Change(NamedTuple):
    """One change a rule made to the object (mutations in enforce mode)."""

    policy: str
    rule: str
    what: str


class Decision(NamedTuple):
    """The engine's answer for one object in one phase (immutable; a named
    tuple because a frozen dataclass costs twice as much to build on every
    admission)."""

    allowed: bool = True
    patch: tuple[dict[str, Any], ...] = ()
    warnings: tuple[str, ...] = ()
    findings: tuple[Finding, ...] = ()
    changes: tuple[Change, ...] = ()
    #: the object as the patch leaves it (not part of what the engine decided)
    patched: Any = None
    #: the GPUPolicyExceptions that lifted a rule which would have run on this object
    exceptions: tuple[str, ...] = ()

    @property
    def denials(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.mode == "enforce")

    def message(self) -> str:
        """The denial message: every enforced violation, one per line."""
        return "\n".join(f.text() for f in self.denials)


ALLOW: Final = Decision()
