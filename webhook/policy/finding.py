"""One thing a rule found: a violation, a change it would make, or an informational note."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

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
