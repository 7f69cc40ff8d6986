"""How the GPU quota ledger runs: ``serve``'s ``--quota-*`` flags (docs/quota.md)."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class LedgerSettings:
    #: where the GPUQuotaLedger objects live (the webhook's own namespace, which no webhook reaches)
    namespace: str = "gpu-admission"
    #: a charge whose pod the cluster view has not shown for this long is checked and released:
    #: longer than a create request can take in kube-apiserver (its --request-timeout, 60 s by default)
    window: float = 90.0
    #: how often the ledgers are recounted from the pods of the cluster view (the quota controller's resync)
    recount: float = 300.0
    #: how long admission may spend on the ledger (below the validating webhook's timeoutSeconds, 5 s in deploy/)
    budget: float = 3.0
    #: reservations (docs/quota.md): at most this many GPUs of one shape held by one replica, granted
    #: only when at least ``reserve_min`` fit in a ``reserve_share``-th of the room a cap leaves
    #: (so only far from a cap); 0: none, every pod's charge is written before its answer
    reserve_max: int = 64
    reserve_min: int = 8
    reserve_share: int = 4
    #: seconds a reservation admits pods (then returned and granted anew): well inside the window
    reserve_life: float = 10.0
    #: seconds between the writes that record the charges of pods admitted against reservations
    record_every: float = 0.5

    @property
    def life(self) -> float:
        """How long a reservation admits pods: at most a quarter of the window, after which (since it was
        granted) another replica may free it."""
        return min(self.reserve_life, self.window / 4)

    @property
    def lease(self) -> float:
        """How long a ledger's statement of a policy's caps lives unless renewed (``webhook.ledger.statements``):
        each replica renews its own every ``lease / 4`` seconds at most, and in every write of the ledger."""
        return max(4 * self.sweep, 30.0)

    @property
    def sweep(self) -> float:
        """How often charges are checked against the cluster view: a few times per window."""
        return min(max(self.window / 4, 0.25), 15.0)


def add_arguments(parser: argparse.ArgumentParser, seconds: Callable[[str], float]) -> None:
    """``serve``'s flags; ``seconds`` parses a positive number of seconds (the CLI's own type)."""
    defaults = LedgerSettings()
    parser.add_argument("--quota-namespace", default=defaults.namespace,
                        help="namespace of the GPUQuotaLedger objects (default: %(default)s)")
    parser.add_argument("--quota-window", type=seconds, default=defaults.window,
                        help="seconds a charge waits for its pod before it is released (default: %(default)s)")
    parser.add_argument("--quota-recount", type=seconds, default=defaults.recount,
                        help="seconds between recounts of the ledgers from the cluster's pods (default: %(default)s)")
    parser.add_argument("--quota-budget", type=seconds, default=defaults.budget,
                        help="seconds admission may spend charging the ledger (default: %(default)s)")


def settings(args: argparse.Namespace) -> LedgerSettings:
    return LedgerSettings(args.quota_namespace, args.quota_window, args.quota_recount, args.quota_budget)
