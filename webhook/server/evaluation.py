"""Evaluating one review within its limits, on the event loop or off it.

Small reviews (nearly all) are evaluated inline: a thread hop costs more
than their evaluation. Large ones go to a worker thread with a deadline
below the webhook timeout, so that one big object never stalls the answers
to everyone else. Past the deadline the answer is the same as for an object
past the limits (allowed unchanged with a warning on /mutate, refused on
/validate); the worker finishes its evaluation in the background and its
result is dropped. The worker pool is small, so runaway evaluations queue
behind each other instead of taking every CPU.

The inline evaluations of the reviews read in the same turn of the event
loop run together in the next one (``Turns``), then their answers are made
one after the other: see ``Turns`` for why. A review is parsed in its turn,
not when its body is read: see ``Turns`` for that too.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Generic, NamedTuple, TypeVar

from webhook import review
from webhook.policy import engine
from webhook.policy.decision import Decision, Finding
from webhook.policy.loader import PolicySet
from webhook.policy.request import Phase
from webhook.server.limits import Limits
from webhook.view.protocol import ClusterView

log = logging.getLogger(__name__)

WORKERS = 2
#: admissions evaluated and answered in one turn of the event loop, at most (~2-5 ms of it): a
#: burst of thousands is handled in turns, with health checks and the answers' writes between them
BATCH = 32
#: and their reviews' bytes, at most (a turn takes one admission whatever its size): evaluation grows
#: with the object, so a turn of large reviews (a 20-container pod is ~66 KB) ends sooner, and
#: health checks, small reviews and the answers' writes are not held up behind tens of ms of them
TURN_BYTES = 256 * 1024

_Answered = TypeVar("_Answered")
_Done = TypeVar("_Done")
#: what ``decide`` takes
DecideArgs = tuple[PolicySet, review.Review, ClusterView, Phase, Limits, int]
#: what a turn takes of an admission: ``decide``'s, its review as its body's bytes (parsed in its turn)
#: or parsed already (when something had to read it before: the registry resolver's prefetch)
TurnArgs = tuple[PolicySet, bytes | review.Review, ClusterView, Phase, Limits, int]


class Outcome(NamedTuple):
    """A decision, and what happened when it was not the engine's own ("error", "limit", "deadline")."""

    decision: Decision
    refused: str = ""


class Decided(NamedTuple):
    """An admission's outcome and the review it was parsed into in its turn, given back unanswered
    (``Turns``): its task must do something before it is answered."""

    outcome: Outcome
    parsed: review.Review


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


class Turns(Generic[_Answered, _Done]):
    """The admissions whose reviews were read in the same turn of the event loop, taken together in
    the next: all parsed and evaluated (``decide``), then all answered (``answer``), then all
    counted and logged (``account``), one after the other; at most ``BATCH`` per turn, and reviews
    of at most ``TURN_BYTES`` in all (but at least one).

    Under load, the turn that reads requests reads one from each of several connections. Taken one
    at a time, each admission's evaluation, answer and log line ran cold, between its connection's
    TLS and HTTP work: the engine's code and data were out of the CPU's caches every time. Taken
    together, only the first of a turn runs cold: on one core that is about a fifth less CPU per
    admission (docs/performance.md, "Admissions taken together"). A lone review is evaluated one
    turn after it was read, with nothing in between. An admission whose task was cancelled is
    skipped: the server stopping cancels its handlers' tasks (a client that goes away does not, with
    aiohttp's default ``handler_cancellation=False``), so an admission still waiting for its turn then
    is neither answered nor counted. Event loop thread only.

    A review is parsed in its turn, not as soon as its body is read: what waits for the turn is one
    bytes object, not the review's tree of dicts, lists and strings. Parsed on reading, the reviews
    of a turn were built while the bodies of the others were read and decrypted, and freed when each
    task resumed, after the whole turn: thousands of objects each, made and freed far from where they
    are used, the allocator's and the CPU caches' work growing with the turn (docs/performance.md,
    "Parsed in its turn"). A body that is no AdmissionReview fails its own admission with the
    ReviewError (its task answers 400), as one whose evaluation fails.
    """

    def __init__(
        self, answer: Callable[[Outcome, review.Review, Any], _Answered | Outcome],
        account: Callable[[_Answered, review.Review, Any], _Done],
    ) -> None:
        self._answer, self._account = answer, account
        self._waiting: list[tuple[TurnArgs, Any, asyncio.Future[_Done | Decided]]] = []
        self._sizes: list[int] = []  # each waiting admission's review, in bytes
        #: the loop a turn is scheduled on, while one is
        self._scheduled: asyncio.AbstractEventLoop | None = None
        #: admissions taken into a turn since the server started (webhook.server.memory looks at it)
        self.taken = 0

    def submit(self, args: TurnArgs, context: Any, size: int = 0) -> asyncio.Future[_Done | Decided]:
        """``account(answer(decide(*args), parsed, context), parsed, context)`` once the turn this
        admission joins has run (``parsed``: the review ``args`` holds, parsed if it is its body); or
        the outcome and the review, when ``answer`` gives the outcome back (what the admission's task
        must do before it is answered: the GPU quota ledger's charge). ``size``: the review's bytes."""
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        if self._scheduled is not loop:  # the first of a turn's
            if self._scheduled is not None:  # a turn left on a loop that stopped: its admissions went with it
                self._waiting.clear()
                self._sizes.clear()
            loop.call_soon(self._run, loop)
            self._scheduled = loop
        self._waiting.append((args, context, future))
        self._sizes.append(size)
        return future

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        waiting, sizes = self._waiting, self._sizes
        taken, total = 1, sizes[0] if sizes else 0
        while taken < len(sizes) and taken < BATCH and total + sizes[taken] <= TURN_BYTES:
            total += sizes[taken]
            taken += 1
        batch = waiting[:taken]
        del waiting[:taken], sizes[:taken]
        self.taken += taken
        self._scheduled = None
        if waiting:  # the rest in the next turn, after what is ready meanwhile (health checks, writes)
            loop.call_soon(self._run, loop)
            self._scheduled = loop
        try:
            self._take(batch)
        finally:  # whatever escaped, no admission of the turn is left waiting for ever
            for _, _, future in batch:
                if not future.done():
                    _fail(future, RuntimeError("the admission's turn failed"))

    def _take(self, batch: list[tuple[TurnArgs, Any, asyncio.Future[_Done | Decided]]]) -> None:
        decided: list[tuple[Outcome, review.Review, Any, asyncio.Future[_Done | Decided]]] = []
        parse = review.parse_review
        for (policy_set, body, view, phase, limits, objects), context, future in batch:
            if future.cancelled():  # (the server stopping cancels the handlers' tasks)
                continue
            try:
                parsed = parse(body) if type(body) is bytes else body
                decided.append((decide(policy_set, parsed, view, phase, limits, objects), parsed, context, future))  # type: ignore[arg-type]
            except Exception as exc:  # (a ReviewError: not a review; decide answers the engine's errors itself) one
                _fail(future, exc)  # bad body or bug fails its own request only
        answer, account = self._answer, self._account
        answered: list[tuple[Any, review.Review, Any, asyncio.Future[_Done | Decided]]] = []
        for outcome, parsed, context, future in decided:
            try:
                made = answer(outcome, parsed, context)
            except Exception as exc:
                _fail(future, exc)
                continue
            if isinstance(made, Outcome):
                future.set_result(Decided(made, parsed))
            else:
                answered.append((made, parsed, context, future))
        for made, parsed, context, future in answered:
            try:
                future.set_result(account(made, parsed, context))
            except Exception as exc:
                _fail(future, exc)


def _fail(future: asyncio.Future[Any], exc: BaseException) -> None:
    """``future`` failed with ``exc`` (a StopIteration, which a future refuses, as a RuntimeError)."""
    if isinstance(exc, StopIteration):
        exc = RuntimeError(f"StopIteration: {exc}")
    future.set_exception(exc)


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
