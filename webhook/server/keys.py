"""Typed keys of the aiohttp application's state."""

from __future__ import annotations

from collections.abc import Callable

from aiohttp import web

from webhook.policy.view import ClusterView
from webhook.server.metrics import Metrics
from webhook.server.policies import PolicyStore
from webhook.server.tls import ReloadingTLS

STORE = web.AppKey("store", PolicyStore)
METRICS = web.AppKey("metrics", Metrics)
#: returns the cluster view in force (it can change when the index starts)
VIEW = web.AppKey("view", Callable[[], ClusterView])
TLS = web.AppKey("tls", ReloadingTLS)
#: each returns "" when ready, else why not
READY_CHECKS = web.AppKey("ready_checks", list[Callable[[], str]])
