"""What the engine decided: allowed or not, the patch, warnings and findings."""

from __future__ import annotations

from typing import Any, Final, NamedTuple

from webhook.policy.charges import Charge
from webhook.policy.finding import Finding

__all__ = ["ALLOW", "Change", "Decision", "Finding"]


#: One change a rule made to the object (mutations in enforce mode): (policy, rule, what). A plain
#: tuple, read by unpacking: compiled, one is built in a few dozen instructions where a named tuple's
#: takes ~850 (``tuple.__new__`` of a subtype), and a pod is changed five times or so per admission.
Change = tuple[str, str, str]


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
    #: what the pod charges to the GPU caps the quota rule enforces (webhook.policy.charges): the
    #: server writes them to the ledger before it allows the pod
    charges: tuple[Charge, ...] = ()

    @property
    def denials(self) -> tuple[Finding, ...]:
        return tuple(f for f in self.findings if f.mode == "enforce")

    def message(self) -> str:
        """The denial message: every enforced violation, one per line."""
        return "\n".join(f.text() for f in self.denials)


ALLOW: Final = Decision()
