"""A second validating webhook that refuses labelled pods: a pod refused after gpu-admission charged it.

kube-apiserver calls validating webhooks in parallel: gpu-admission charges
the pod's GPUs to the ledger while this one refuses the pod, which is never
stored. It runs in a thread of the test process behind real TLS.
"""

from __future__ import annotations

import base64
import contextlib
import json
import ssl
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.e2e.kube import Kube
from tests.support import send_json
from webhook import certs

SELECT_LABEL = "e2e.gpu-admission.io/deny"
MESSAGE = "refused by the e2e denying webhook"


class _Handler(BaseHTTPRequestHandler):
    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        response = {"uid": review["request"]["uid"], "allowed": False, "status": {"code": 403, "message": MESSAGE}}
        send_json(self, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def registered(admin: Kube, folder: Path) -> Iterator[None]:
    """The webhook running and registered for pods labelled ``SELECT_LABEL: on``, until the block ends."""
    ca, cert, key = certs.generate_files(folder, ["localhost"], ["127.0.0.1"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.load_cert_chain(cert, key)
    server.socket = context.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    config = {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": "zz-e2e-denying"},
        "webhooks": [{
            "name": "deny.e2e.gpu-admission.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "timeoutSeconds": 5,
            "clientConfig": {"url": f"https://127.0.0.1:{server.server_address[1]}/deny",
                             "caBundle": base64.b64encode(ca.read_bytes()).decode()},
            "objectSelector": {"matchLabels": {SELECT_LABEL: "on"}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
        }],
    }
    admin.create(config)
    try:
        yield
    finally:
        admin.delete(config)
        server.shutdown()
        server.server_close()
