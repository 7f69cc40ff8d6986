"""``gpu-admission serve``: certificates, cluster view, app, and the TLS listener."""

from __future__ import annotations

import argparse
import asyncio
import logging
import signal
from collections.abc import Callable
from pathlib import Path

from aiohttp import web

from webhook import certs, cluster
from webhook.cluster import ClusterIndex
from webhook.errors import GpuAdmissionError
from webhook.policy import view
from webhook.server import listener
from webhook.registry import flags
from webhook.cluster.discovery import served_resources
from webhook.server.app import AppConfig, create_app
from webhook.server.limits import Limits
from webhook.server.metrics import Metrics
from webhook.server.tls import ReloadingTLS

log = logging.getLogger(__name__)

DEV_CERTS = Path("certs")


def serve(args: argparse.Namespace) -> int:
    cert, key = _certificate_files(args)
    tls = ReloadingTLS(cert, key, args.client_ca)
    limits = Limits(body_timeout=args.body_timeout, deadline=args.eval_deadline)
    app = create_app(
        AppConfig(policies=args.policies, reload_interval=args.reload_interval, limits=limits, freeze_gc_after_sync=True),
        tls=tls,
        cluster=_cluster_builder(args),
        images=flags.settings(args, budget=args.registry_budget_ms / 1000),
    )
    config = listener.ListenerConfig(
        host=args.host, port=args.port, header_timeout=args.header_timeout, trickle=args.park_after,
        idle_timeout=args.idle_timeout, max_connections=args.max_connections,
    )
    asyncio.run(_serve(app, config, tls, args.drain, args.shutdown_timeout))
    return 0


async def _serve(app: web.Application, config: listener.ListenerConfig, tls: ReloadingTLS, drain: float, timeout: float) -> None:
    """Serve until SIGTERM or SIGINT, then drain and stop within ``timeout`` seconds."""
    try:
        running = await listener.start(app, config, tls.context)
    except OSError as exc:
        raise GpuAdmissionError(f"cannot listen on {config.host}:{config.port}: {exc.strerror or exc}") from exc
    loop = asyncio.get_running_loop()
    log.info("serving on https://%s:%d (event loop: %s)", config.host, running.port,
             "uvloop" if type(loop).__module__.startswith("uvloop") else "asyncio")
    stop = asyncio.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    log.info("stopping: not ready, serving for %g s more, then answering what is in flight (at most %g s in all)", drain, timeout)
    await running.stop(drain=drain, timeout=timeout)
    log.info("stopped")


def _cluster_builder(args: argparse.Namespace) -> Callable[[Metrics], ClusterIndex] | None:
    """The live cluster index, or None without a cluster (the rules then see an empty one)."""
    if args.no_cluster:
        log.info("--no-cluster: rules see an empty cluster")
        return None
    api_client = cluster.load_api_client(args.kubeconfig, args.context)
    if api_client is None:
        log.warning("no in-cluster credentials and no kubeconfig: rules see an empty cluster")
        return None
    resources = served_resources(api_client)
    log.info("cluster view: list+watch of %s", ", ".join(resources))
    return lambda metrics: cluster.ClusterIndex(api_client, resources=resources, registry=metrics.registry)


def _certificate_files(args: argparse.Namespace) -> tuple[Path, Path]:
    """The given pair, or the development pair in certs/ (generated when absent)."""
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise SystemExit("give both --tls-cert and --tls-key")
        return args.tls_cert, args.tls_key
    cert, key = DEV_CERTS / certs.TLS_CERT, DEV_CERTS / certs.TLS_KEY
    if not (cert.exists() and key.exists()):
        names = ["localhost", *certs.service_names("gpu-admission", "gpu-admission")]
        ca, cert, key = certs.generate_files(DEV_CERTS, names, ["127.0.0.1", "::1"])
        log.warning("generated a development CA: %s (use it as the webhook caBundle)", ca.resolve())
    return cert, key
