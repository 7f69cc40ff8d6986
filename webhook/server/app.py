"""The aiohttp application factory and its background work."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from aiohttp import web

from webhook import logs
from webhook.errors import CertificateError
from webhook.ledger.charger import Ledger
from webhook.policy.loader import PolicySet
from webhook.registry.resolver import ResolverSettings, running
from webhook.registry.view import ResolvedView
from webhook.server import evaluation, handlers, keys, memory
from webhook.server.limits import Limits
from webhook.server.metrics import Metrics
from webhook.server.policies import PolicyStore
from webhook.server.tls import ReloadingTLS
from webhook.view.protocol import ClusterView
from webhook.view.snapshot import EMPTY_VIEW

if TYPE_CHECKING:  # (the cluster index and its kubernetes client: imported by serve only with a cluster)
    from webhook.cluster import ClusterIndex

log = logging.getLogger(__name__)

#: runs the GPU quota ledger beside the cluster index: (index, the policies in force, metrics) → the ledger
LedgerBuilder = Callable[["ClusterIndex", Callable[[], PolicySet], Metrics], AbstractAsyncContextManager[Ledger]]

@dataclass(frozen=True)
class AppConfig:
    policies: Path
    reload_interval: float = 2.0
    limits: Limits = Limits()
    #: move everything alive once the server has started (its modules, policies, compiled core), and
    #: again after the first cluster sync, out of the garbage collector's reach: a full collection
    #: over them walks ~85,000 objects without a cluster view (~75 ms), and stalls requests for hundreds
    #: of milliseconds over a large index. Process-wide, so only for `serve`.
    freeze_gc_after_sync: bool = False
    #: a compiled output (``policies compile -o DIR``) installed in the cluster: its rule parts are skipped
    compiled: Path | None = None
    #: /metrics on this app's (TLS) port; serve --metrics-port moves it to a plain port of its own
    serve_metrics: bool = True
    #: serve --log-mutations: the line per admission for a patch at INFO (by default at DEBUG: the object
    #: carries its own note of what changed, docs/robustness.md "Logs")
    log_mutations: bool = False


def create_app(
    config: AppConfig,
    *,
    tls: ReloadingTLS | None = None,
    view: ClusterView | None = None,
    metrics: Metrics | None = None,
    cluster: Callable[[Metrics], ClusterIndex] | None = None,
    images: ResolverSettings | None = None,
    ledger: LedgerBuilder | None = None,
    log_output: logs.Output | None = None,
) -> web.Application:
    """Build the app. Raises PolicyError when the policy directory is invalid.

    ``cluster`` builds the live cluster index (given the app's metrics); it is
    started in the background when the app starts, the app is ready once it
    has synced, and it answers the rules' cluster questions. Without it the
    rules see ``view`` (default: an empty cluster). ``images`` turns on the
    registry resolver: admission waits for unknown images at most its budget.
    ``ledger`` (with ``cluster``) runs the GPU quota ledger, which charges a
    pod's enforced GPU caps in the API server before it is allowed.
    ``log_output``: the handler logs.configure installed, which the line per
    admission is written to directly.
    """
    app = web.Application(client_max_size=config.limits.max_body_bytes)
    store = PolicyStore(config.policies, config.compiled)
    app[keys.STORE] = store
    app[keys.METRICS] = metrics or Metrics()
    app[keys.LIMITS] = config.limits
    app[keys.DRAINING] = asyncio.Event()
    app[keys.TURNS] = evaluation.Turns(handlers.answer_inline, handlers.account)
    if log_output is not None:
        app[keys.LOG_OUTPUT] = log_output
    app[keys.LOG_MUTATIONS] = config.log_mutations
    app.on_response_prepare.append(_close_when_draining)
    app.cleanup_ctx.append(_executor_ctx)
    fixed_view = view or EMPTY_VIEW
    app[keys.VIEW] = lambda: fixed_view
    # policies are loaded by now (an invalid directory raises above); the
    # cluster index adds its own check when it runs
    app[keys.READY_CHECKS] = []
    app[keys.METRICS].policies_loaded.set(len(store.current.policies))
    app[keys.METRICS].policy_set.info({"digest": store.digest})
    app[keys.METRICS].policy_files_loadable.set(1)
    app[keys.METRICS].reloads.labels("success")
    app[keys.METRICS].reloads.labels("error")
    if tls is not None:
        app[keys.TLS] = tls
        _export_cert_expiry(app, tls)
    if config.freeze_gc_after_sync:
        app.on_startup.append(_freeze_gc)
    if cluster is not None:
        app.cleanup_ctx.append(_cluster_ctx(cluster, config.freeze_gc_after_sync, ledger))
    if images is not None:  # after the cluster: it wraps the view the cluster index set
        app.cleanup_ctx.append(_registry_ctx(images))
    app.cleanup_ctx.append(_watch(config.reload_interval, lambda: _reload_policies(app)))
    app.cleanup_ctx.append(_trim_after_bursts(app[keys.TURNS]))
    if tls is not None:
        app.cleanup_ctx.append(_watch(config.reload_interval, lambda: _reload_tls(app, tls)))
    app.router.add_post("/mutate", handlers.mutate)
    app.router.add_post("/validate", handlers.validate)
    app.router.add_get("/healthz", handlers.healthz)
    app.router.add_get("/readyz", handlers.readyz)
    if config.serve_metrics:
        app.router.add_get("/metrics", handlers.metrics)
    return app


async def _close_when_draining(request: web.Request, response: web.StreamResponse) -> None:
    """While draining, each answer ends its connection: the client's next request opens a new
    one, which lands on another replica once endpoints have moved."""
    if request.app[keys.DRAINING].is_set():
        response.force_close()
        # aiohttp has written its own Connection header by the time this hook runs
        response.headers["Connection"] = "close"


async def _executor_ctx(app: web.Application) -> AsyncIterator[None]:
    app[keys.EXECUTOR] = ThreadPoolExecutor(evaluation.WORKERS, thread_name_prefix="evaluate")
    yield
    app[keys.EXECUTOR].shutdown(wait=False, cancel_futures=True)


def _registry_ctx(settings: ResolverSettings) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        async with running(settings) as resolver:
            app[keys.RESOLVER] = resolver
            base = app[keys.VIEW]
            app[keys.VIEW] = lambda: ResolvedView(base(), resolver)
            yield

    return ctx


async def _reload_policies(app: web.Application) -> None:
    store, metrics = app[keys.STORE], app[keys.METRICS]
    # the stat, read, parse and validation in a worker thread: a large policy directory, or a slow
    # volume, is no request's wait; the swap after it on the loop. (_watch runs one check at a time.)
    change = await asyncio.to_thread(store.read_change)
    result = None if change is None else store.use(change)
    metrics.policy_files_loadable.set(0 if store.last_error else 1)
    if result is None:
        return
    metrics.reloads.labels("success" if result else "error").inc()
    metrics.policies_loaded.set(len(store.current.policies))
    metrics.policy_set.info({"digest": store.digest})


async def _reload_tls(app: web.Application, tls: ReloadingTLS) -> None:
    metrics = app[keys.METRICS]
    try:
        # the stat, read, check and the new context's build in a worker thread (a slow volume or
        # OpenSSL's parse is no handshake's wait); the swap after it on the loop. One at a time (_watch).
        rotation = await asyncio.to_thread(tls.read_change)
    except CertificateError as exc:
        log.error("new certificate not loaded, keeping the one in force: %s", exc)
        metrics.tls_reloads.labels("error").inc()
        return
    if rotation is not None and tls.use(rotation):
        metrics.tls_reloads.labels("success").inc()
        _export_cert_expiry(app, tls)


def _export_cert_expiry(app: web.Application, tls: ReloadingTLS) -> None:
    app[keys.METRICS].cert_not_after.labels("serving").set(tls.not_after)
    if tls.client_ca is not None:
        app[keys.METRICS].cert_not_after.labels("client-ca").set(tls.client_ca_not_after)


def _cluster_ctx(
    build: Callable[[Metrics], ClusterIndex], freeze_gc: bool, ledger: LedgerBuilder | None
) -> Callable[[web.Application], AsyncIterator[None]]:
    async def ctx(app: web.Application) -> AsyncIterator[None]:
        index = build(app[keys.METRICS])
        app[keys.VIEW] = lambda: index
        app[keys.READY_CHECKS].append(lambda: "" if index.synced() else f"cluster view not synced: {_unsynced(index)}")
        async with contextlib.AsyncExitStack() as stack:
            if ledger is not None:  # (before the index starts: it follows the index's pods)
                store = app[keys.STORE]
                charged = app[keys.LEDGER] = await stack.enter_async_context(
                    ledger(index, lambda: store.current, app[keys.METRICS]))
                # enforced caps with no ledger resource would admit every pod unchecked (fail-open)
                app[keys.READY_CHECKS].append(charged.not_ready)
            await index.start()
            freezer = asyncio.create_task(_freeze_gc_when_synced(index)) if freeze_gc else None
            try:
                yield
            finally:
                if freezer is not None:
                    freezer.cancel()
                await index.stop()

    return ctx


async def _freeze_gc(app: web.Application) -> None:
    """What is alive once the app has started, out of the collector's scans (the reviews in flight
    are then the young generations' whole walk, and a full collection no longer walks the modules)."""
    gc.collect()
    gc.freeze()


async def _freeze_gc_when_synced(index: ClusterIndex) -> None:
    while not await index.wait_synced(timeout=60):
        pass
    gc.collect()
    gc.freeze()
    log.info("cluster view synced")
    log.debug("%d objects moved out of the garbage collector's scans", gc.get_freeze_count())


def _unsynced(index: ClusterIndex) -> str:
    return ", ".join(sorted(r for r in index.resources if not index.synced([r])))


def _trim_after_bursts(turns: evaluation.Turns[Any, Any]) -> Callable[[web.Application], AsyncIterator[None]]:
    """The C allocator's free pages handed back once a burst of admissions is over (webhook.server.memory)."""
    trimmer = memory.Trimmer(lambda: turns.taken)

    async def look() -> None:
        trimmer.look()

    return _watch(memory.LOOK_INTERVAL, look)


def _watch(interval: float, check: Callable[[], Awaitable[None]]) -> Callable[[web.Application], AsyncIterator[None]]:
    """A cleanup_ctx entry that runs ``check`` every ``interval`` seconds until shutdown, one at a time."""

    async def loop() -> None:
        while True:
            await asyncio.sleep(interval)
            try:
                await check()
            except Exception:  # a watcher must outlive any one bad check
                log.exception("background check failed")

    async def ctx(app: web.Application) -> AsyncIterator[None]:
        task = asyncio.create_task(loop())
        yield
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    return ctx
