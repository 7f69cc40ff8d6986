"""What ``serve`` imports: without a cluster, nothing of the kubernetes client (~20 MB resident), nor
cryptography (~9 MB), nor the CEL compiler (~1.4 MB)."""

from __future__ import annotations

import json
import subprocess
import sys

from tests.conftest import Pki
from tests.support import POLICIES, REPO, free_ports

#: runs the CLI's serve in this process; once it answers /readyz, prints the top-level packages
#: imported by then and stops it as kubelet does (SIGTERM)
SERVE_AND_LIST = """
import json, os, signal, ssl, sys, threading, time, urllib.request

port, argv = int(sys.argv[1]), sys.argv[2:]

def list_and_stop():
    context = ssl._create_unverified_context()
    for _ in range(600):
        try:
            urllib.request.urlopen(f"https://127.0.0.1:{port}/readyz", context=context, timeout=1)
            break
        except OSError:
            time.sleep(0.1)
    print(json.dumps(sorted({name.split(".")[0] for name in sys.modules} | set(sys.modules))), flush=True)
    os.kill(os.getpid(), signal.SIGTERM)

threading.Thread(target=list_and_stop, daemon=True).start()
from webhook.cli import main
sys.exit(main(argv))
"""


def test_serve_without_a_cluster_imports_no_kubernetes_client(pki: Pki) -> None:
    port = free_ports(1)[0]
    argv = ["serve", "--no-cluster", "--policies", str(POLICIES), "--host", "127.0.0.1", "--port", str(port),
            "--tls-cert", str(pki.cert), "--tls-key", str(pki.key), "--shutdown-timeout", "2", "--drain", "0"]
    done = subprocess.run([sys.executable, "-c", SERVE_AND_LIST, str(port), *argv], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    modules = set(json.loads(done.stdout.splitlines()[0]))
    assert "webhook.server.handlers" in modules  # (it served)
    assert not {"kubernetes", "kubernetes_validate", "webhook.cluster.index", "webhook.audit"} & modules
    # nor the cryptography package (~9 MB resident): the standard library reads the serving pair
    assert not {"cryptography", "webhook.certs"} & modules
    # nor the CEL compiler (~1.4 MB), which only `policies compile` runs
    assert not {"webhook.cel", "webhook.cel.command"} & modules
