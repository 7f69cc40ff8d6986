"""Before a pod is allowed: its charges written to the GPU quota ledger, and the decision the ledger makes of it.

The engine states what an allowed pod charges to the caps it enforces
(``Decision.charges``); this is where the server charges them
(``webhook.ledger.charger``), on a dry run judges them only, and turns what
the ledger says into the answer: a denial naming the cap and where the
team's GPUs are, or, when the ledger cannot be reached within the budget,
what each rule's ``clusterUnavailable`` says (fail-open: allowed, with a
warning; fail-closed: denied); when the API server refused the ledger's write
for what it holds (too large, invalid, forbidden), a denial whatever
``clusterUnavailable`` says. A pod refused after some of its charges were
written gives them back.

While replicas on another policy version state caps in the ledgers that this
replica's policies do not define identically (``webhook.ledger.statements``:
a rollout), a new pod is judged under those too, and charged for them in the
same writes (:func:`stated`).
"""

from __future__ import annotations

import logging

from webhook.ledger import statements
from webhook.ledger.charger import Ledger
from webhook.policy import charges
from webhook.policy.decision import Decision
from webhook.policy.loader import PolicySet
from webhook.policy.request import Request
from webhook.view.protocol import ClusterView

log = logging.getLogger(__name__)


def stated(ledger: Ledger, request: Request, phase: str) -> bool:
    """Whether the request is a new pod that caps of other policy versions, stated in the ledgers, apply to."""
    return (phase == "validate" and request.operation == "CREATE" and request.kind == "Pod" and not request.group
            and not request.sub_resource and bool(ledger.store.others()))


async def settle(ledger: Ledger, request: Request, decision: Decision, policies: PolicySet | None = None,
                 view: ClusterView | None = None) -> Decision:
    """``decision`` once its charges are settled (unchanged when it has none or denies already); with
    ``policies`` and ``view``, judged and charged under the caps other policy versions state too."""
    if decision.allowed and policies is not None and view is not None and (others := ledger.store.others()):
        decision = statements.stated_decision(statements.others_set(others, policies), request, view, decision)
    if not decision.charges or not decision.allowed:
        return decision
    settlement = await ledger.settle(decision.charges, request.dry_run)
    findings = settlement.denials
    if not findings and settlement.refused:
        # the API server refused the write for what it holds: no rule's clusterUnavailable admits past that
        findings = charges.refused(decision.charges, settlement.unavailable)
        ledger.metrics.unavailable.labels("fail-closed").inc()
        ledger.metrics.refused.labels(settlement.refused).inc()
        log.error("GPU quota ledger write refused (%s) for %s: %s; the pod is refused whatever clusterUnavailable "
                  "says", settlement.refused, request.subject, settlement.unavailable)
    elif not findings and settlement.unavailable:
        findings = charges.unavailable(decision.charges, settlement.unavailable)
        closed = any(f.mode == "enforce" for f in findings)
        ledger.metrics.unavailable.labels("fail-closed" if closed else "fail-open").inc()
        log.warning("GPU quota ledger unavailable for %s: %s", request.subject, settlement.unavailable)
    if not findings:
        return decision
    allowed = not any(f.mode == "enforce" for f in findings)
    if not allowed and settlement.charged:
        ledger.release(settlement.charged, "rolled-back")
    warnings = tuple(f.text() for f in findings if f.mode == "warn")
    return decision._replace(allowed=allowed, findings=decision.findings + findings,
                             warnings=decision.warnings + warnings)
