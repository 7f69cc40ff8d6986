"""Typed keys of the aiohttp application's state."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from aiohttp import web

from webhook.ledger.charger import Ledger
from webhook.logs import Output
from webhook.registry.resolver import Resolver
from webhook.server.evaluation import Turns
from webhook.server.limits import Limits
from webhook.server.metrics import Metrics
from webhook.server.policies import PolicyStore
from webhook.server.tls import ReloadingTLS
from webhook.view.protocol import ClusterView

STORE = web.AppKey("store", PolicyStore)
METRICS = web.AppKey("metrics", Metrics)
#: returns the cluster view in force (it can change when the index starts)
ViewGetter = Callable[[], ClusterView]
VIEW: web.AppKey[ViewGetter] = web.AppKey("view")
TLS = web.AppKey("tls", ReloadingTLS)
#: each returns "" when ready, else why not
ReadyCheck = Callable[[], str]
READY_CHECKS: web.AppKey[list[ReadyCheck]] = web.AppKey("ready_checks")
LIMITS = web.AppKey("limits", Limits)
#: the worker threads that evaluate large objects off the event loop
EXECUTOR = web.AppKey("executor", ThreadPoolExecutor)
#: the inline evaluations and answers, run together per turn of the event loop
TURNS = web.AppKey("turns", Turns)
#: set on SIGTERM: /readyz answers 503 and every answer closes its connection
DRAINING = web.AppKey("draining", asyncio.Event)
#: the registry resolver, when image resolution is on (serve --resolve-images)
RESOLVER = web.AppKey("resolver", Resolver)
#: the GPU quota ledger, when the server runs with a cluster (docs/quota.md)
LEDGER = web.AppKey("ledger", Ledger)
#: where `serve` writes its log lines (logs.configure), for the line per admission; absent in tests
LOG_OUTPUT = web.AppKey("log_output", Output)
#: serve --log-mutations: an admission that only patches is logged at INFO (else at DEBUG)
LOG_MUTATIONS = web.AppKey("log_mutations", bool)
