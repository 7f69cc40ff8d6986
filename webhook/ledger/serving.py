"""Whether the API server serves GPUQuotaLedgers: an install that skipped the CRD must not fail open silently.

With a quota cap in ``enforce`` and the ledger's resource not served
(discovery of ``gpu-admission.io/v1alpha1`` answers 404, or lists no
``gpuquotaledgers``), every charge would fail with a 404 and each rule's
``clusterUnavailable`` (``fail-open`` by default) would admit every pod: the
caps would hold nothing. So the server is not Ready then (``/readyz`` says
why), logs it once per change, and exports it; discovery is asked again every
few seconds, and the server is Ready once the CRD is installed.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable

from webhook.cluster.session import ApiError, ApiSession
from webhook.ledger import document
from webhook.ledger.metrics import LedgerMetrics
from webhook.policy import charges
from webhook.policy.loader import PolicySet

log = logging.getLogger(__name__)

#: seconds between discovery checks while the resource is not served (or discovery failed), and once it is
RETRY_EVERY, CHECK_EVERY = 5.0, 60.0
#: the discovery document of the ledger's group and version
DISCOVERY_PATH = f"/apis/{document.GROUP}/{document.VERSION}"
CRD_FILE = "deploy/base/quota-ledger-crd.yaml"


class LedgerServing:
    """What discovery last said of the ledger's resource, and the readiness problem it makes."""

    def __init__(self, session: ApiSession, policies: Callable[[], PolicySet], metrics: LedgerMetrics) -> None:
        self._session, self._policies, self._metrics = session, policies, metrics
        #: None until discovery answered once (or failed: then taken as served, not to block on a hiccup)
        self.served: bool | None = None
        self._said = ""  # the problem last logged

    async def check(self, timeout: float = 5.0) -> None:
        """Ask discovery now; note the answer (an error other than a 404 leaves the last one standing)."""
        try:
            found = await self._session.request("GET", DISCOVERY_PATH, timeout=timeout)
        except ApiError as exc:
            if exc.status == 404:
                self._note(False)
            else:
                log.warning("API discovery of %s failed (%s): taking GPUQuotaLedgers as served", DISCOVERY_PATH, exc)
                self._note(True if self.served is None else self.served)
            return
        plurals = {str(r.get("name") or "") for r in found.get("resources") or () if isinstance(r, dict)}
        self._note(document.PLURAL in plurals)

    def _note(self, served: bool) -> None:
        self.served = served
        self._metrics.served.set(1 if served else 0)
        self.said()

    def said(self) -> str:
        """The readiness problem (:meth:`problem`), logged when it changed since last said (once per change,
        however often probed), and exported."""
        problem = self.problem()
        self._metrics.missing.set(1 if problem else 0)
        if problem != self._said:
            if problem:
                log.error("not ready: %s", problem)
            elif self._said:
                log.info("GPUQuotaLedgers are served: the GPU quota caps are enforced through the ledger")
            self._said = problem
        return problem

    def problem(self) -> str:
        """Why the server is not ready for the ledger ("" : it is): enforced caps and no ledger resource."""
        if self.served:
            return ""
        enforcing = charges.enforcing(self._policies().policies)
        if not enforcing:
            return ""
        if self.served is None:
            return "GPU quota ledger: API discovery not answered yet"
        return (f"GPU quota caps are enforced (policies {', '.join(enforcing)}) but the API server does not serve "
                f"GPUQuotaLedgers ({document.PLURAL}.{document.GROUP}/{document.VERSION}: 404): "
                f"every pod would be admitted unchecked; install {CRD_FILE}")

    async def run(self) -> None:
        """Check now, then every few seconds (often while not served), until cancelled."""
        while True:
            await self.check()
            await asyncio.sleep(CHECK_EVERY if self.served else RETRY_EVERY)
