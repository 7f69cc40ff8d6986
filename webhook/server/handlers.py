"""HTTP handlers: read → decode → evaluate → encode, and the health endpoints."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable
from types import MappingProxyType
from typing import Any, NamedTuple, cast

from aiohttp import web
from aiohttp.abc import AbstractStreamWriter
from aiohttp.helpers import rfc822_formatted_time
from aiohttp.http import HttpVersion11
from multidict import CIMultiDict

from webhook import log_line, review
from webhook.errors import RequestBodyError, ReviewError, UnreadableReview
from webhook.logs import JsonFormatter, Output
from webhook.policy.decision import Decision
from webhook.policy.request import Phase
from webhook.registry.resolver import Resolver, unknown_images
from webhook.server import charging, evaluation, keys
from webhook.server.body import read_body
from webhook.server.limits import Limits
from webhook.server.metrics import Metrics
from webhook.server.policies import PolicyStore

log = logging.getLogger(__name__)


#: the admission endpoints and their phases
ENDPOINTS: dict[str, Phase] = {"/mutate": "mutate", "/validate": "validate"}


class Served(NamedTuple):
    """What every admission reads of the application's state, read once: each ``app[key]`` is a
    Python call (~300 instructions), and an admission made eight. Set by the time the app has
    started (its cleanup contexts put the view and the resolver in place), and not changed after."""

    app: web.Application
    metrics: Metrics
    limits: Limits
    store: PolicyStore
    view: keys.ViewGetter
    resolver: Resolver | None
    log_output: Output | None
    log_mutations: bool
    turns: evaluation.Turns[Answered, bytes]


def served(app: web.Application) -> Served:
    """The state admissions read, from a started ``app``."""
    return Served(
        app, app[keys.METRICS], app[keys.LIMITS], app[keys.STORE], app[keys.VIEW], app.get(keys.RESOLVER),
        app.get(keys.LOG_OUTPUT), app[keys.LOG_MUTATIONS], app[keys.TURNS],
    )


async def mutate(request: web.Request) -> web.StreamResponse:
    return await admit(served(request.app), request, "/mutate")


async def validate(request: web.Request) -> web.StreamResponse:
    return await admit(served(request.app), request, "/validate")


def dispatch(app: web.Application) -> Callable[[web.BaseRequest], Awaitable[web.StreamResponse]]:
    """The listener's request handler: a POST to /mutate or /validate goes straight to ``admit``,
    everything else through the application (its router answers 404 and 405, and serves the
    health and metrics endpoints). Every admission request passes here: aiohttp's router, its
    match info and its response signal cost ~5% of a request's CPU. The app has no middleware.

    It reads the request's method, headers and target from what aiohttp's parser made of them
    (``_method``, ``_headers``, ``_message.path``), not through the request's properties: each is
    worked out by an interpreted function on its first read (~1,000 instructions each, the path's
    through yarl), on every request. The target is taken as sent, up to its query: one spelt any other
    way than "/mutate" or "/validate" (percent-escapes, dot segments, an absolute URL) goes through the
    router, which reads it as a URL."""
    fallback, draining = app._handle, app[keys.DRAINING]
    endpoints, state = ENDPOINTS, served(app)

    async def handle(request: web.BaseRequest) -> web.StreamResponse:
        if request._method == "POST" and "Expect" not in request._headers:
            path = _message(request).path.partition("?")[0]
            if path in endpoints:
                response = await admit(state, request, path)
                if draining.is_set():  # (what app.py's close_when_draining does for the router's answers)
                    response.force_close()
                if type(response) is Answer:
                    response.hooked = True  # (the app's response hooks are for what the router matched)
                return response
        return await fallback(request)  # type: ignore[arg-type]

    return handle


def _message(request: web.BaseRequest) -> Any:
    """What aiohttp's parser made of the request's head (read as Any: compiled, the NamedTuple aiohttp
    declares would be checked, and its C parser makes another type)."""
    return cast(Any, request)._message


async def admit(state: Served, request: web.BaseRequest, endpoint: str) -> web.StreamResponse:
    """Read → decode → evaluate → encode one AdmissionReview sent to ``endpoint`` (/mutate, /validate)."""
    started = time.perf_counter()
    phase = ENDPOINTS[endpoint]
    metrics, limits = state.metrics, state.limits
    try:
        body = await read_body(request, limits.max_body_bytes, limits.body_timeout)
        objects, body = _read_objects(body, limits.max_objects)
        resolver = state.resolver
        context: Context = (state, endpoint, phase, started)
        if resolver is None and len(body) < limits.offload_bytes:
            # parsed, evaluated and answered with the other reviews read in the same turn (evaluation.Turns)
            args: evaluation.TurnArgs = (state.store.current, body, state.view(), phase, limits, objects)
            done = await state.turns.submit(args, context, len(body))
        else:
            parsed = review.parse_review(body)
            if resolver is not None:  # waits at most its budget; the rest resolves in the background
                await resolver.prefetch(unknown_images(parsed.request.object))
            args = (state.store.current, parsed, state.view(), phase, limits, objects)
            if len(body) >= limits.offload_bytes:
                outcome = await evaluation.decide_off_loop(state.app[keys.EXECUTOR], args[0], parsed, *args[2:])
                _count_refusal(state, outcome)
                done = evaluation.Decided(outcome, parsed)
            else:
                done = await state.turns.submit(args, context, len(body))
        if type(done) is bytes:  # answered in its turn
            return Answer(done)
        assert isinstance(done, evaluation.Decided)
        outcome, parsed = done  # judged off the loop, or a pod to charge to the GPU quota ledger first
    except RequestBodyError as exc:
        metrics.reject(exc.reason)
        log.info("request refused: %s", exc, extra={"status": exc.status, "endpoint": endpoint})
        response = _refuse(exc.status, str(exc), close=True)
        if exc.status == 408:
            # a client too slow to send its body gets no lingering read of the rest: answer, then close
            await response.prepare(request)
            await response.write_eof()
            request.protocol.force_close()
        return response
    except UnreadableReview as exc:  # a review kube-apiserver sent that cannot be judged: refused in an answer
        metrics.count_request(endpoint, "", "", "deny", frozenset())
        log.info("refused unread: %s", exc, extra={"uid": exc.uid, "endpoint": endpoint})
        metrics.observe_latency(endpoint, time.perf_counter() - started)
        return Answer(review.encode(review.refusal(exc.api_version, exc.uid, str(exc))))
    except ReviewError as exc:
        metrics.count_request(endpoint, "", "", "error", frozenset())
        log.info("malformed AdmissionReview: %s", exc, extra={"status": 400, "endpoint": endpoint})
        return _refuse(400, str(exc))
    decision = outcome.decision
    ledger = state.app.get(keys.LEDGER)
    # a new pod under enforced GPU caps (or caps another policy version states): charged to the ledger
    # before it is allowed
    if ledger is not None and (decision.charges or charging.stated(ledger, parsed.request, phase)):
        decision = await charging.settle(ledger, parsed.request, decision, args[0], args[2])
    return Answer(account(answered(decision, outcome.refused, parsed, context), parsed, context))


#: what an admission is answered from, besides its review: (its state, endpoint, phase, perf_counter at its start)
Context = tuple[Served, str, Phase, float]


class Answered(NamedTuple):
    """An admission's answer, encoded, and the decision and refusal it answered."""

    decision: Decision
    refused: str
    body: bytes


def answer_inline(outcome: evaluation.Outcome, parsed: review.Review, context: Context) -> Answered | evaluation.Outcome:
    """The answer to an admission evaluated inline (evaluation.Turns); or its outcome, when the GPU
    quota ledger must charge it first (which its task does)."""
    _count_refusal(context[0], outcome)
    ledger = context[0].app.get(keys.LEDGER)
    if ledger is not None and (outcome.decision.charges or charging.stated(ledger, parsed.request, context[2])):
        return outcome
    return answered(outcome.decision, outcome.refused, parsed, context)


def _count_refusal(state: Served, outcome: evaluation.Outcome) -> None:
    if outcome.refused in ("limit", "deadline"):  # (as soon as it is decided: counted whatever comes next)
        state.metrics.reject(outcome.refused)


def answered(decision: Decision, refused: str, parsed: review.Review, context: Context) -> Answered:
    """``decision``'s answer, encoded (a patch over the size limit dropped)."""
    state, _, phase, _ = context
    decision, payload = _answer(parsed, decision, phase, state.limits.max_patch_bytes)
    return Answered(decision, refused, review.encode(payload))


def account(done: Answered, parsed: review.Review, context: Context) -> bytes:
    """Count and log an answered admission; its answer's body."""
    state, endpoint, _, started = context
    _observe(state, endpoint, parsed, done.decision, done.refused)
    state.metrics.observe_latency(endpoint, time.perf_counter() - started)
    return done.body


def _read_objects(body: bytes, limit: int) -> tuple[int, bytes]:
    """An upper bound of the JSON objects in ``body``, and the body as it is to be parsed: without its
    objects' ``metadata.managedFields``, which no rule reads, where the compiled build's reader
    (webhook/_envelope.c) reads it; RequestBodyError (413) past ``limit``."""
    objects, trimmed = review.trimmed(body, limit)
    if 0 <= objects <= limit:
        return objects, trimmed
    return _count_objects(body, limit), body  # (not read, or past the limit: counted whole, the 413 says how many)


#: bodies have their "{" counted by deleting them, this many bytes at a time (_count_objects)
_COUNT_CHUNK = 64 * 1024


def _count_objects(body: bytes, limit: int) -> int:
    """An upper bound of the JSON objects in ``body``; RequestBodyError (413) past ``limit``."""
    # bytes.count of one byte reads a byte at a time (21 µs on the 66 KB 20-container pod); deleting
    # them finds each with memchr, half the time on a review, but ~30x slower on a body of little but
    # "{" (25 ms on 3 MiB of them): chunk by chunk, until the count is past the limit, the rest then
    # counted the plain way (0.8 ms on 3 MiB), so such a body costs no more than the limit's worth
    size = len(body)
    if size <= _COUNT_CHUNK:
        objects = size - len(body.replace(b"{", b""))
    else:
        objects = start = 0
        while start < size and objects <= limit:
            chunk = body[start:start + _COUNT_CHUNK]
            objects += len(chunk) - len(chunk.replace(b"{", b""))
            start += _COUNT_CHUNK
        if start < size:
            objects += body.count(b"{", start)
    if objects > limit:
        raise RequestBodyError(
            413, "too-many-objects",
            f"the review holds up to {objects} JSON objects; gpu-admission reads at most {limit} (a pod review has a few hundred)",
        )
    return objects


class Answer(web.StreamResponse):
    """An AdmissionReview answer (200, application/json) sent in one piece.

    aiohttp's ``Response`` keeps its headers in a multidict, completes them
    (length, date, server, connection) and serializes them through its stream
    writer, then sends the body: ~10-15 µs of Python on every admission, as
    much as an evaluation. This builds the status line, its headers and the
    body as one bytes object and hands it to the transport in one write. It
    is a StreamResponse for aiohttp's request handler, which calls
    ``prepare`` (that sends it) and ``write_eof`` (then a no-op), and reads
    ``keep_alive``: ``force_close`` before it is sent closes the connection
    after it, as for any response. What aiohttp does around a write stays:
    the application's response hooks run before it (a request routed by
    the router: the drain's ``Connection: close``), and it waits while the
    transport is paused (a client that sends and does not read is not
    answered into an unbounded buffer).

    It does not run StreamResponse's ``__init__`` (an interpreted frame, a
    header multidict and a status lookup: ~5,000 instructions an admission):
    what aiohttp reads of a response it answers (its status, keep-alive,
    whether it is sent) is StreamResponse's class defaults or this class's
    below, and the header multidict, which only the app's response hooks
    touch, is made before they run (``prepare``; the head it sends is its
    own either way).
    """

    _status = 200
    _reason = "OK"
    #: a response's own mapping (``resp[key]``), which no one keeps on an answer: read-only, not shared
    _state = MappingProxyType[str, Any]({})  # type: ignore[assignment]

    def __init__(self, body: bytes) -> None:
        self._answer = body
        #: the app's response hooks ran or are not for it (dispatch's fast path does their part)
        self.hooked = False

    async def prepare(self, request: web.BaseRequest) -> AbstractStreamWriter | None:
        if self._eof_sent:
            return None
        if not self.hooked:  # (the app's on_response_prepare, for a request the router matched)
            self._headers = CIMultiDict()
            await request._prepare_hook(self)
        keep_alive = self._keep_alive
        if keep_alive is None:  # (what the request's keep_alive and version say, read without their properties)
            keep_alive = self._keep_alive = not _message(request).should_close
        version = request._version
        if version == HttpVersion11:
            head = _HEAD_11 if keep_alive else _HEAD_11_CLOSE
        else:  # HTTP/1.0 closes unless asked to keep the connection
            head = (_HEAD_10_KEEP if keep_alive else _HEAD_10) % (version.major, version.minor)
        body = self._answer
        transport = request.transport
        if transport is None or transport.is_closing():
            raise ConnectionResetError("cannot write to a closing transport")
        transport.write(head % (len(body), rfc822_formatted_time().encode()) + body)
        self._eof_sent, self._body_length = True, len(body)
        writer = request._payload_writer
        if transport.get_write_buffer_size():  # (as aiohttp's write_eof: wait while the transport is paused,
            await writer.drain()               # which it only is with answers still buffered)
        return writer


_HEAD = b"Content-Type: application/json\r\nContent-Length: %d\r\nDate: %s\r\n"
_HEAD_11 = b"HTTP/1.1 200 OK\r\n" + _HEAD + b"\r\n"
_HEAD_11_CLOSE = b"HTTP/1.1 200 OK\r\n" + _HEAD + b"Connection: close\r\n\r\n"
_HEAD_10 = b"HTTP/%d.%d 200 OK\r\n" + _HEAD.replace(b"%", b"%%") + b"\r\n"
_HEAD_10_KEEP = b"HTTP/%d.%d 200 OK\r\n" + _HEAD.replace(b"%", b"%%") + b"Connection: keep-alive\r\n\r\n"


def _refuse(status: int, message: str, *, close: bool = False) -> web.Response:
    """A 4xx with a Status body; ``close`` when the rest of the body must not be read."""
    response = web.json_response(review.error_body(message), status=status)
    if close:
        response.force_close()
    return response


def _answer(parsed: review.Review, decision: Decision, phase: Phase, max_patch_bytes: int) -> tuple[Decision, review.ReviewJSON]:
    """The decision answered and its AdmissionReview. A patch past the limit is dropped (kube-apiserver
    would store a megabyte-sized change): the object is allowed unchanged, with a warning saying why."""
    mutating = phase == "mutate"
    payload = review.build_response(parsed, decision, mutating=mutating)
    size = len(payload["response"].get("patch", ""))
    if size <= max_patch_bytes:
        return decision, payload
    text = f"gpu-admission did not change this object: its patch of {size} bytes is over the {max_patch_bytes}-byte limit"
    decision = decision._replace(patch=(), warnings=(text,))
    return decision, review.build_response(parsed, decision, mutating=mutating)


def _observe(state: Served, endpoint: str, parsed: review.Review, decision: Decision, refused: str) -> None:
    metrics = state.metrics
    req = parsed.request
    outcome = _outcome(decision, refused)
    metrics.count_request(endpoint, req.kind, req.operation, outcome, state.store.known_kinds)
    metrics.count_findings(decision.findings)
    if decision.exceptions:
        metrics.count_exceptions(endpoint, decision.exceptions)
    log_decision(state.log_output, endpoint, parsed, decision, outcome, state.log_mutations)


def log_decision(output: Output | None, endpoint: str, parsed: review.Review, decision: Decision, outcome: str,
                 mutations: bool = False) -> None:
    """The line per admission: INFO for a denial or an audit finding, and for a patch with ``mutations``
    (serve --log-mutations), DEBUG otherwise; written to ``output`` (`serve`'s, without a LogRecord) or
    through this module's logger. A patch is not logged at INFO by default: the object it changed
    carries the note of what changed and which policy did it (the provenance annotation), kube-apiserver's
    audit log records the patch, and the requests metric counts it; as in Gatekeeper (--log-mutations)."""
    findings = decision.findings
    if outcome == "deny" or outcome == "error":
        level = logging.INFO
    elif findings and any(f.audited for f in findings):
        # what audit-mode rules would refuse or change: the operator trying them before enforcing them reads it
        # (a patched admission's line says "patch" and names them among its rules)
        level = logging.INFO
        if outcome != "patch":
            outcome = "audit"
    elif outcome == "patch" and mutations:
        level = logging.INFO
    else:
        level = logging.DEBUG
    if not log.isEnabledFor(level):  # allowed unchanged at INFO: no line, so no fields worked out for one
        return
    if output is not None:
        formatter = output.formatter
        if type(formatter) is JsonFormatter:  # (the format in a pod: the line made in one piece, compiled)
            when = formatter.clock.text(time.time())
            output.lines.write(log_line.decision_line(
                when, "info" if level == logging.INFO else "debug", log.name, endpoint, parsed, decision, outcome))
            return
    text, fields = log_line.decision_fields(endpoint, parsed, decision, outcome)
    if output is not None:
        output.fields(log, level, f"{outcome}: {text}", fields)
    else:
        log.log(level, "%s: %s", outcome, text, extra=fields)


def _outcome(decision: Decision, refused: str) -> str:
    if refused == "error":
        return "error"
    if not decision.allowed:
        return "deny"
    if decision.patch:
        return "patch"
    return "warn" if decision.warnings else "allow"


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    if request.app[keys.DRAINING].is_set():
        return web.Response(status=503, text="not ready: shutting down\n")
    problems = [check() for check in request.app[keys.READY_CHECKS]]
    problems = [p for p in problems if p]
    if problems:
        return web.Response(status=503, text="not ready: " + "; ".join(problems) + "\n")
    return web.Response(text="ready\n")


async def metrics(request: web.Request) -> web.Response:
    body = request.app[keys.METRICS].render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
