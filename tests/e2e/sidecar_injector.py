"""A second mutating webhook, the way a sidecar injector (Istio, Vault, a logging agent) is one.

It adds a container ``injected-sidecar`` to labelled pods, once (and, asked by
``CLASS_LABEL``, the label that decides a pod's workload class): its patch
changes the object after gpu-admission's, so kube-apiserver calls
gpu-admission again (``reinvocationPolicy: IfNeeded``). It runs in a thread of
the test process behind real TLS.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from tests.support import send_json
from webhook import certs

SELECT_LABEL = "e2e.gpu-admission.io/inject-sidecar"
SIDECAR = {"name": "injected-sidecar", "image": "busybox:1.36", "command": ["sleep", "infinity"]}


#: a pod labelled so also gets the workload-class label of this value, after gpu-admission's first call
CLASS_LABEL = "e2e.gpu-admission.io/inject-class"


def _patch(pod: dict[str, Any]) -> list[dict[str, Any]]:
    patch: list[dict[str, Any]] = []
    labels = pod.get("metadata", {}).get("labels") or {}
    wanted = labels.get(CLASS_LABEL)
    if wanted and labels.get("gpu-admission.io/workload-class") != wanted:
        patch.append({"op": "add", "path": "/metadata/labels/gpu-admission.io~1workload-class", "value": wanted})
    containers = pod.get("spec", {}).get("containers") or []
    if not any(c.get("name") == SIDECAR["name"] for c in containers):
        patch.append({"op": "add", "path": "/spec/containers/-", "value": SIDECAR})
    return patch


class _Handler(BaseHTTPRequestHandler):
    calls: list[int]

    def do_POST(self) -> None:  # noqa: N802 - http.server's name
        review = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        request = review["request"]
        patch = _patch(request.get("object") or {})
        self.server.calls.append(len(patch))  # type: ignore[attr-defined]
        response: dict[str, Any] = {"uid": request["uid"], "allowed": True}
        if patch:
            response |= {"patchType": "JSONPatch", "patch": base64.b64encode(json.dumps(patch).encode()).decode()}
        send_json(self, {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response})

    def log_message(self, *args: Any) -> None:
        pass


@contextmanager
def running(folder: Path) -> Iterator[tuple[str, bytes, list[int]]]:
    """(url, caBundle, patch sizes of each call) of a running injector."""
    ca, cert, key = certs.generate_files(folder, ["localhost"], ["127.0.0.1"])
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.calls = []  # type: ignore[attr-defined]
    ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    ctx.load_cert_chain(cert, key)
    server.socket = ctx.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"https://127.0.0.1:{server.server_address[1]}/inject", ca.read_bytes(), server.calls  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


def configuration(url: str, ca_bundle: bytes) -> dict[str, Any]:
    """Named to sort after gpu-admission, so it is called after it."""
    return {
        "apiVersion": "admissionregistration.k8s.io/v1", "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "zz-e2e-sidecar-injector"},
        "webhooks": [{
            "name": "inject.e2e.gpu-admission.io", "admissionReviewVersions": ["v1"], "sideEffects": "None",
            "failurePolicy": "Fail", "timeoutSeconds": 5, "reinvocationPolicy": "Never",
            "clientConfig": {"url": url, "caBundle": base64.b64encode(ca_bundle).decode()},
            "objectSelector": {"matchLabels": {SELECT_LABEL: "on"}},
            "rules": [{"apiGroups": [""], "apiVersions": ["v1"], "operations": ["CREATE"], "resources": ["pods"]}],
        }],
    }
