"""``gpu-admission serve``: certificates, cluster view, app, and the TLS listener it runs behind."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from webhook import cluster, collector, compiled, logs
from webhook.ledger import settings as ledger_settings
from webhook.registry import flags
from webhook.server import listener, loop
from webhook.server.app import AppConfig, LedgerBuilder, create_app
from webhook.server.limits import Limits
from webhook.server.metrics import Metrics
from webhook.server.tls import ReloadingTLS

if TYPE_CHECKING:
    from webhook.cluster import ClusterIndex

log = logging.getLogger(__name__)

DEV_CERTS = Path("certs")


def serve(args: argparse.Namespace, output: logs.Output) -> int:
    new_loop = loop.factory(args.event_loop)  # --event-loop uvloop without uvloop fails before any work
    core = compiled.policy_core()  # the image runs it compiled (setup.py); a mix means a broken build
    (log.warning if core == "partly compiled" else log.info)("policy core: %s", core)
    if args.client_name and not args.client_ca:
        raise SystemExit("--client-name needs --client-ca (the CA that signs the names it accepts)")
    cert, key = _certificate_files(args)
    tls = ReloadingTLS(cert, key, args.client_ca)
    limits = Limits(body_timeout=args.body_timeout, deadline=args.eval_deadline)
    api_client = _api_client(args)
    metrics = Metrics()
    metrics.count_log_drops(lambda: output.dropped)
    app = create_app(
        AppConfig(policies=args.policies, reload_interval=args.reload_interval, limits=limits, freeze_gc_after_sync=True,
                  compiled=args.compiled, serve_metrics=args.metrics_port is None, log_mutations=args.log_mutations),
        tls=tls,
        cluster=_cluster_builder(api_client) if api_client is not None else None,
        images=flags.settings(args, budget=args.registry_budget_ms / 1000),
        ledger=_ledger_builder(api_client, args) if api_client is not None else None,
        metrics=metrics,
        log_output=output,
    )
    config = listener.ListenerConfig(
        host=args.host, port=args.port, header_timeout=args.header_timeout, trickle=args.park_after,
        idle_timeout=args.idle_timeout, handshake_timeout=args.handshake_timeout, max_connections=args.max_connections,
        client_names=frozenset(args.client_name), metrics_port=args.metrics_port,
    )
    with collector.fewer_collections(collector.SERVE_YOUNG_THRESHOLD):
        loop.run(listener.serve(app, config, tls.context, drain=args.drain, timeout=args.shutdown_timeout), new_loop)
    return 0


def _api_client(args: argparse.Namespace) -> cluster.ApiClient | None:
    """The API server the cluster view follows, or None without a cluster (the rules then see an empty one)."""
    if args.no_cluster:
        log.info("--no-cluster: rules see an empty cluster")
        return None
    api_client = cluster.load_api_client(args.kubeconfig, args.context)
    if api_client is None:
        log.warning("no in-cluster credentials and no kubeconfig: rules see an empty cluster")
    return api_client


def _cluster_builder(api_client: cluster.ApiClient) -> Callable[[Metrics], ClusterIndex]:
    """The live cluster index."""
    # (here: the cluster's modules import the kubernetes client, which serve --no-cluster does without)
    from webhook.cluster.discovery import served_resources

    resources = served_resources(api_client)
    log.info("cluster view: list+watch of %s", ", ".join(resources))
    return lambda metrics: cluster.ClusterIndex(api_client, resources=resources, registry=metrics.registry)


def _ledger_builder(api_client: cluster.ApiClient, args: argparse.Namespace) -> LedgerBuilder:
    """The GPU quota ledger, in the API server the cluster view follows."""
    from webhook.ledger import upkeep as ledger_upkeep

    settings = ledger_settings.settings(args)
    log.info("GPU quota ledger: GPUQuotaLedgers in namespace %s, release window %gs, recount every %gs",
             settings.namespace, settings.window, settings.recount)
    return lambda index, policies, metrics: ledger_upkeep.running(api_client, index, policies, settings,
                                                                  metrics.registry)


def _certificate_files(args: argparse.Namespace) -> tuple[Path, Path]:
    """The given pair, or the development pair in certs/ (generated when absent)."""
    if args.tls_cert or args.tls_key:
        if not (args.tls_cert and args.tls_key):
            raise SystemExit("give both --tls-cert and --tls-key")
        return args.tls_cert, args.tls_key
    cert, key = DEV_CERTS / "tls.crt", DEV_CERTS / "tls.key"
    if not (cert.exists() and key.exists()):
        from webhook import certs  # (only here: cryptography is ~9 MB resident, which serve does without)

        names = ["localhost", *certs.service_names("gpu-admission", "gpu-admission")]
        ca, cert, key = certs.generate_files(DEV_CERTS, names, ["127.0.0.1", "::1"])
        log.warning("generated a development CA: %s (use it as the webhook caBundle)", ca.resolve())
    return cert, key
