"""Admissions taken together (webhook.server.evaluation.Turns): the reviews read in one turn of the
event loop are evaluated, answered and counted in the next, each with its own answer."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
from typing import Any

import pytest

from tests.conftest import StartWebhook
from tests.support import REVIEWS, load_review, shipped_policies
from webhook import review
from webhook.errors import ReviewError
from webhook.server import evaluation
from webhook.server.limits import Limits
from webhook.view.snapshot import EMPTY_VIEW

TRAINING = load_review(REVIEWS / "000_mutate_create_pods_.json")


def _reviews(count: int) -> list[dict[str, Any]]:
    """``count`` different reviews of GPU pods: their own uid and name, 1 to 4 GPUs, every other one a
    PyTorchJob's worker (its own job in its training locality: a patch of its own), every third one
    asking GPUs in requests only (refused by /validate)."""
    sent = []
    for n in range(count):
        body = copy.deepcopy(TRAINING)
        body["request"]["uid"] = f"00000000-0000-4000-8000-{n:012d}"
        pod = body["request"]["object"]
        pod["metadata"]["name"] = f"trainer-{n}"
        pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": str(1 + n % 4)}}
        if n % 2:
            pod["metadata"]["labels"] = {"training.kubeflow.org/job-name": f"job-{n}", "training.kubeflow.org/replica-type": "worker"}
        if n % 3 == 0:  # and some refused: requests without limits
            pod["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpu": "1"}}
        sent.append(body)
    return sent


async def _answers(webhook: Any, path: str, bodies: list[dict[str, Any]], together: bool) -> list[dict[str, Any]]:
    if together:
        return list(await asyncio.gather(*(webhook.review(path, body) for body in bodies)))
    return [await webhook.review(path, body) for body in bodies]


async def test_reviews_sent_together_are_each_answered_as_when_sent_alone(
    start_webhook: StartWebhook, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="webhook.server.handlers")
    webhook = await start_webhook(log_mutations=True)  # (a line per patch too: serve --log-mutations)
    bodies = _reviews(40)
    patched = 0
    for path in ("/mutate", "/validate"):  # (sent together: a connection each, aiohttp's client opens up to 100)
        alone = await _answers(webhook, path, bodies, together=False)
        together = await _answers(webhook, path, bodies, together=True)
        assert [a["response"]["uid"] for a in together] == [b["request"]["uid"] for b in bodies]
        assert together == alone
        # (different answers, each where it belongs)
        assert len({a["response"].get("patch") for a in together}) > (2 if path == "/mutate" else 0)
        assert {a["response"]["allowed"] for a in together} == ({True} if path == "/mutate" else {True, False})
        patched += sum(1 for a in alone if "patch" in a["response"])
        denied = sum(1 for a in alone if not a["response"]["allowed"])
    lines = [r.getMessage().split(":")[0] for r in caplog.records if r.name == "webhook.server.handlers"]
    assert lines.count("patch") == 2 * patched and lines.count("deny") == 2 * denied > 0  # a line each
    metrics = await (await webhook.session.get(webhook.base + "/metrics")).text()  # each counted once
    line = 'gpu_admission_requests_total{decision="patch",endpoint="/mutate",kind="Pod",operation="CREATE"}'
    assert f"{line} {2 * patched}.0" in metrics and patched > 0


def _turns(seen: list[Any]) -> evaluation.Turns[Any, Any]:
    """Turns whose answer records the context it answers and gives the decision back, unless told otherwise."""

    def answer(outcome: evaluation.Outcome, parsed: review.Review, context: Any) -> Any:
        assert parsed.request.operation == "CREATE"  # (the review its body was parsed into)
        seen.append(context)
        if context == "fails":
            raise ValueError("a bug in one answer")
        if context == "stops":  # (a future refuses a StopIteration: set_exception raises TypeError)
            raise StopIteration("a stray next()")
        if context == "charge first":
            return outcome
        return (context, outcome.decision.allowed)

    return evaluation.Turns(answer, lambda made, parsed, context: ("accounted", *made))


class _Unparsed(bytes):
    """Bytes of a subclass: the turn parses only exactly ``bytes``, and takes anything else for a review."""


def _args(n: int, body: bytes | None = None) -> evaluation.TurnArgs:
    """An admission's, its review as its body (parsed in its turn)."""
    if body is None:
        sent = copy.deepcopy(TRAINING)
        sent["request"]["uid"] = f"uid-{n}"
        body = json.dumps(sent).encode()
    return (shipped_policies(), body, EMPTY_VIEW, "mutate", Limits(), 1000)


async def test_a_turn_takes_at_most_a_batch_and_the_rest_in_the_next_turn() -> None:
    seen: list[Any] = []
    turns = _turns(seen)
    futures = [turns.submit(_args(n), n) for n in range(evaluation.BATCH + 5)]
    assert not any(f.done() for f in futures)  # (nothing before the loop's next turn)
    await asyncio.sleep(0)
    assert [f.done() for f in futures] == [True] * evaluation.BATCH + [False] * 5
    await asyncio.sleep(0)
    assert [f.result() for f in futures] == [("accounted", n, True) for n in range(evaluation.BATCH + 5)]
    assert seen == list(range(evaluation.BATCH + 5))


async def test_a_turn_of_large_reviews_ends_at_its_byte_bound_and_takes_at_least_one() -> None:
    seen: list[Any] = []
    turns = _turns(seen)
    third = evaluation.TURN_BYTES // 3
    sizes = [third, third, third, evaluation.TURN_BYTES * 4, 10, third]
    futures = [turns.submit(_args(n), n, size) for n, size in enumerate(sizes)]
    done_after: list[list[bool]] = []
    for _ in range(4):
        await asyncio.sleep(0)
        done_after.append([f.done() for f in futures])
    # three thirds fill a turn; an outsized review takes a turn of its own; the rest fit in one
    assert done_after == [[True] * 3 + [False] * 3, [True] * 4 + [False] * 2, [True] * 6, [True] * 6]
    assert seen == list(range(len(sizes)))


async def test_a_cancelled_admission_is_skipped_a_failure_fails_only_its_own() -> None:
    seen: list[Any] = []
    turns = _turns(seen)
    first, gone, fails, stops, charged, last = (turns.submit(_args(n), c) for n, c in enumerate(
        ("first", "gone", "fails", "stops", "charge first", "last")))
    broken = _args(5)
    # a body the turn takes for a review parsed already (it is not exactly bytes): decide fails on it
    unreadable = turns.submit((broken[0], _Unparsed(b"{}"), *broken[2:5], 10**6), "unreadable")
    gone.cancel()  # (the server stopping: aiohttp cancels its handlers' tasks)
    await asyncio.sleep(0)
    assert seen == ["first", "fails", "stops", "charge first", "last"]
    assert first.result() == ("accounted", "first", True) and last.result() == ("accounted", "last", True)
    assert isinstance(fails.exception(), ValueError) and isinstance(stops.exception(), RuntimeError)
    # decide itself failed (interpreted: no .request; compiled: no Review), only its own admission
    assert isinstance(unreadable.exception(), (AttributeError, TypeError))
    decided = charged.result()  # given back unanswered: the admission's task charges the ledger, then answers
    assert isinstance(decided, evaluation.Decided) and decided.outcome.decision.patch
    assert decided.parsed.uid == "uid-4"  # (with the review its body was parsed into in the turn)


async def test_a_body_is_parsed_in_its_turn_one_that_is_no_review_fails_only_its_own() -> None:
    seen: list[Any] = []
    turns = _turns(seen)
    first = turns.submit(_args(0), "first")
    not_json = turns.submit(_args(1, b'{"apiVersion": '), "not json")
    no_request = turns.submit(_args(2, b'{"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview"}'), "no request")
    policies, body, *rest = _args(3)
    parsed_before = turns.submit((policies, review.parse_review(body), *rest), "parsed before")  # type: ignore[arg-type]
    last = turns.submit(_args(4), "last")
    await asyncio.sleep(0)
    assert seen == ["first", "parsed before", "last"]
    assert first.result() == ("accounted", "first", True) and last.result() == ("accounted", "last", True)
    assert parsed_before.result() == ("accounted", "parsed before", True)  # (a review parsed already is taken as it is)
    for failed in (not_json, no_request):  # (the admission's task answers its ReviewError with a 400)
        assert isinstance(failed.exception(), ReviewError)


def test_a_turn_left_on_a_loop_that_stopped_does_not_hold_up_the_next_loop() -> None:
    seen: list[Any] = []
    turns = _turns(seen)
    first = asyncio.new_event_loop()
    left: list[Any] = []
    first.call_soon(lambda: left.append(turns.submit(_args(0), "left")))
    first.call_soon(first.stop)  # (stops before the turn that submit scheduled)
    first.run_forever()
    first.close()
    assert not left[0].done() and seen == []

    async def admit() -> Any:
        return await asyncio.wait_for(turns.submit(_args(1), "next"), 5)

    assert asyncio.run(admit()) == ("accounted", "next", True)
    assert seen == ["next"]  # (the stopped loop's admission dropped with its loop)
