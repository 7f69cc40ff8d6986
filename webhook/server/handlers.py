"""HTTP handlers: decode → evaluate → encode, and the health endpoints."""

from __future__ import annotations

import json
import logging
import time

from aiohttp import web

from webhook import review
from webhook.errors import ReviewError
from webhook.policy import engine
from webhook.policy.decision import Decision, Finding
from webhook.policy.request import Phase
from webhook.registry.resolver import unknown_images
from webhook.server import keys

log = logging.getLogger(__name__)


async def mutate(request: web.Request) -> web.Response:
    return await _admit(request, "mutate")


async def validate(request: web.Request) -> web.Response:
    return await _admit(request, "validate")


async def _admit(request: web.Request, phase: Phase) -> web.Response:
    started = time.perf_counter()
    app = request.app
    metrics = app[keys.METRICS]
    endpoint = request.path
    body = await request.read()  # aiohttp answers 413 itself past client_max_size
    try:
        parsed = review.parse_review(body)
    except ReviewError as exc:
        metrics.requests.labels(endpoint, "", "", "error").inc()
        return web.json_response(review.error_body(str(exc)), status=400)
    resolver = app.get(keys.RESOLVER)
    if resolver is not None:  # waits at most its budget; the rest resolves in the background
        await resolver.prefetch(unknown_images(parsed.request.object))
    try:
        decision = engine.evaluate(app[keys.STORE].current, parsed.request, app[keys.VIEW](), phase)
    except Exception:  # a bug must not turn into an opaque "failed calling webhook"
        log.exception("evaluating %s %s (uid %s) failed", parsed.request.operation, parsed.request.subject, parsed.uid)
        metrics.requests.labels(endpoint, parsed.request.kind, parsed.request.operation, "error").inc()
        return _json(review.build_response(parsed, internal_error(phase), mutating=False))
    payload = review.build_response(parsed, decision, mutating=phase == "mutate")
    _observe(app, endpoint, parsed, decision)
    metrics.latency.labels(endpoint).observe(time.perf_counter() - started)
    return _json(payload)


def _json(payload: object) -> web.Response:
    return web.Response(body=json.dumps(payload, separators=(",", ":")), content_type="application/json")


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


def _observe(app: web.Application, endpoint: str, parsed: review.Review, decision: Decision) -> None:
    metrics = app[keys.METRICS]
    req = parsed.request
    if not decision.allowed:
        outcome = "deny"
        log.info("denied %s %s (uid %s): %s", req.operation, req.subject, parsed.uid, decision.message())
    elif decision.patch:
        outcome = "patch"
    elif decision.warnings:
        outcome = "warn"
    else:
        outcome = "allow"
    metrics.requests.labels(endpoint, req.kind, req.operation, outcome).inc()
    for finding in decision.findings:
        metrics.findings.labels(finding.policy, finding.rule, finding.mode).inc()


async def healthz(request: web.Request) -> web.Response:
    return web.Response(text="ok\n")


async def readyz(request: web.Request) -> web.Response:
    problems = [check() for check in request.app[keys.READY_CHECKS]]
    problems = [p for p in problems if p]
    if problems:
        return web.Response(status=503, text="not ready: " + "; ".join(problems) + "\n")
    return web.Response(text="ready\n")


async def metrics(request: web.Request) -> web.Response:
    body = request.app[keys.METRICS].render()
    return web.Response(body=body, headers={"Content-Type": "text/plain; version=0.0.4; charset=utf-8"})
