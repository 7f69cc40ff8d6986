"""What the engine answered for one object, as a test's expectations read it."""

from __future__ import annotations

from dataclasses import dataclass

from webhook.audit.judge import Outcome, Result

#: a rule's verdicts, most severe first: a rule with several findings shows the most severe
SEVERITY: tuple[str, ...] = ("deny", "audit", "warn", "mutate", "pass", "skip")


@dataclass(frozen=True)
class Observed:
    """One judged object: the two webhooks' answers, and every rule's outcome on it."""

    result: Result
    outcomes: tuple[Outcome, ...]

    @property
    def verdict(self) -> str:
        return self.result.verdict

    @property
    def messages(self) -> list[str]:
        """Every finding (``[policy/rule] message``) and every warning kubectl would print."""
        return [f.text() for f in self.result.findings] + list(self.result.warnings)

    def rule(self, policy: str, rule: str) -> tuple[str, list[str]]:
        """The rule's verdict ("none" when it does not run on the object) and its messages."""
        found = [o for o in self.outcomes if o.policy == policy and o.rule == rule]
        if not found:
            return "none", []
        changed = any(change[:2] == (policy, rule) for change in self.result.mutation.changes)
        return min((_verdict(o, changed) for o in found), key=SEVERITY.index), [o.message for o in found]

    def rules(self) -> list[tuple[str, str]]:
        """(policy, rule) of every outcome, in the order the engine runs them."""
        return list(dict.fromkeys((o.policy, o.rule) for o in self.outcomes))


def _verdict(outcome: Outcome, changed: bool) -> str:
    if outcome.status == "fail":
        return "deny" if outcome.mode == "enforce" else "audit"
    if outcome.status in ("warn", "skip"):
        return outcome.status
    return "mutate" if changed else "pass"
