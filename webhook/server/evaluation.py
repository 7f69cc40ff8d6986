"""Evaluating one review within its limits, on the event loop or off it.

Small reviews (nearly all) are evaluated inline: a thread hop costs more
than their evaluation. Large ones go to a worker thread with a deadline
below the webhook timeout, so that one big object never stalls the answers
to everyone else. Past the deadline the answer is the same as for an object
past the limits (allowed unchanged with a warning on /mutate, refused on
/validate); the worker finishes its evaluation in the background and its
result is dropped. The worker pool is small, so runaway evaluations queue
behind each other instead of taking every CPU.
"""

from __future__ import annotations

import asyncio
import logging
from concurrent.futures import ThreadPoolExecutor
from typing import NamedTuple

from webhook import review
from webhook.policy import engine
from webhook.policy.decision import Decision, Finding
from webhook.policy.loader import PolicySet
from webhook.policy.request import Phase
from webhook.server.limits import Limits
from webhook.view.protocol import ClusterView

log = logging.getLogger(__name__)

WORKERS = 2


class Outcome(NamedTuple):
    """A decision, and what happened when it was not the engine's own ("error", "limit", "deadline")."""

    decision: Decision
    refused: str = ""


def decide(
    policy_set: PolicySet, parsed: review.Review, view: ClusterView, phase: Phase, limits: Limits, objects: int
) -> Outcome:
    """Check the limits, then evaluate; never raises. ``objects``: an upper bound of the
    JSON objects in the review (its count of "{"), which spares the walk of nearly every object."""
    problem = limits.problem(parsed.request.object) if objects > limits.max_containers else ""
    if problem:
        return Outcome(not_evaluated(phase, problem), "limit")
    try:
        # in place: the server drops the request once it has answered (and nothing reads its object
        # meanwhile), so the rules write into it rather than into copies of what they change
        return Outcome(engine.evaluate(policy_set, parsed.request, view, phase, True))
    except Exception:  # a bug must not turn into an opaque "failed calling webhook"
        log.exception("evaluating %s %s (uid %s) failed", parsed.request.operation, parsed.request.subject, parsed.uid)
        return Outcome(internal_error(phase), "error")


async def decide_off_loop(
    executor: ThreadPoolExecutor, policy_set: PolicySet, parsed: review.Review, view: ClusterView, phase: Phase,
    limits: Limits, objects: int,
) -> Outcome:
    """``decide`` in a worker thread, answered within ``limits.deadline`` seconds."""
    loop = asyncio.get_running_loop()
    work = loop.run_in_executor(executor, decide, policy_set, parsed, view, phase, limits, objects)
    try:
        return await asyncio.wait_for(asyncio.shield(work), limits.deadline)
    except TimeoutError:
        log.warning(
            "evaluation past its deadline",
            extra={"uid": parsed.uid, "kind": parsed.request.kind, "deadline": limits.deadline},
        )
        return Outcome(not_evaluated(phase, f"its evaluation took longer than {limits.deadline:g} s"), "deadline")


def not_evaluated(phase: Phase, why: str) -> Decision:
    """The answer for an object past the limits: fail closed on /validate, unchanged on /mutate."""
    text = f"gpu-admission did not evaluate this object: {why}"
    if phase == "mutate":
        return Decision(allowed=True, warnings=(text + "; nothing was changed",))
    return Decision(allowed=False, findings=(Finding("gpu-admission", "limits", "enforce", text),))


def internal_error(phase: Phase) -> Decision:
    """What to answer when evaluation itself fails.

    Mutation: allow unchanged, with a warning (the validating webhook still
    judges the object). Validation: deny, as failurePolicy Fail would, but
    with a message that says where to look.
    """
    text = "gpu-admission could not evaluate its policies for this object (internal error; see its logs)"
    if phase == "mutate":
        return Decision(allowed=True, warnings=(text + "; nothing was changed",))
    return Decision(allowed=False, findings=(Finding("gpu-admission", "internal", "enforce", text),))
