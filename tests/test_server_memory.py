"""Memory a burst of admissions freed goes back to the system once the burst is over (webhook.server.memory)."""

from __future__ import annotations

import copy
import json
import ssl
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.conftest import Pki
from tests.support import POLICIES, REPO, free_ports
from webhook.server import memory

TRAINING_POD = REPO.parent / "shared/corpus/admissionreviews/kube-apiserver-1.36/000_mutate_create_pods_.json"


def _rss_anon_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("RssAnon:"):
            return int(line.split()[1])
    raise AssertionError("no RssAnon")


def _wide_review() -> bytes:
    """A 20-container pod's review (~66 KB, as bench/server.py's): megabytes in flight over 20 connections."""
    review = json.loads(TRAINING_POD.read_text())
    first = review["request"]["object"]["spec"]["containers"][0]
    review["request"]["object"]["spec"]["containers"] = [
        {**copy.deepcopy(first), "name": f"worker-{i}", "resources": {"limits": {"nvidia.com/gpu": "1"}},
         "env": [{"name": f"SETTING_{n}", "value": f"value-{n}-for-worker-{i}"} for n in range(36)]}
        for i in range(20)
    ]
    return json.dumps(review).encode()


def test_the_freed_pages_of_a_burst_go_back_once_it_is_over(pki: Pki) -> None:
    """A real `serve`: a burst of 20-container pods over 20 connections grows its resident memory; within
    a few seconds of the burst's end most of the growth is back (glibc's heap keeps it otherwise: ~10 MB
    after bench/server.py's load, the same right after and 3 s later before this)."""
    port = free_ports(1)[0]
    server = subprocess.Popen(
        [sys.executable, "-m", "webhook", "--log-level", "WARNING", "serve", "--no-cluster", "--policies", str(POLICIES), "--host", "127.0.0.1",
         "--port", str(port), "--tls-cert", str(pki.cert), "--tls-key", str(pki.key)],
        cwd=REPO, stderr=subprocess.DEVNULL)
    context = ssl.create_default_context(cafile=str(pki.ca))
    context.check_hostname = False
    url = f"https://127.0.0.1:{port}"
    body = _wide_review()

    def admit(_: int) -> None:
        request = urllib.request.Request(url + "/mutate", body, {"Content-Type": "application/json"})
        with urllib.request.urlopen(request, context=context, timeout=30) as answer:
            assert json.loads(answer.read())["response"]["allowed"] is True

    try:
        for _ in range(300):
            try:
                urllib.request.urlopen(url + "/readyz", context=context, timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        time.sleep(2.5)  # (the start's own allocations trimmed or not: the baseline is read after)
        before = _rss_anon_kb(server.pid)
        with ThreadPoolExecutor(20) as pool:
            list(pool.map(admit, range(400)))
        grown = _rss_anon_kb(server.pid)
        assert grown - before > 4_000, (before, grown)  # the burst did grow it (else nothing is proved below)
        deadline, now = time.monotonic() + 6, grown
        while time.monotonic() < deadline:
            time.sleep(0.25)
            now = _rss_anon_kb(server.pid)
            if now - before < (grown - before) / 2:
                break
        assert now - before < (grown - before) / 2, (before, grown, now)
    finally:
        server.terminate()
        server.wait(30)


def test_the_trimmer_trims_once_after_each_burst_and_never_under_load() -> None:
    taken: list[int] = [0]
    trims: list[int] = []

    def trim(pad: int) -> int:  # (the C call's effect is the test below's)
        trims.append(pad)
        return 1

    trimmer = memory.Trimmer(lambda: taken[0], trim)
    trimmer.look()
    assert trims == []  # nothing came since it started
    for _ in range(5):  # steady load: something taken between every two looks
        taken[0] += 7
        trimmer.look()
    assert trims == []
    trimmer.look()  # the burst is over
    assert trims == [0]
    trimmer.look()
    trimmer.look()
    assert trims == [0]  # once per burst
    taken[0] += 1
    trimmer.look()
    trimmer.look()
    assert trims == [0, 0] and trimmer.trims == 2


#: what the test below runs in a fresh interpreter (as `serve` starts): a test runner's worker that has run
#: hundreds of tests holds a heap whose state decides what one trim can give back
_TRIM = """
import sys
from pathlib import Path
from webhook.server import memory

def rss_anon_kb():
    return int(next(l for l in Path("/proc/self/status").read_text().splitlines() if l.startswith("RssAnon:")).split()[1])

trim = memory._malloc_trim()
if trim is None:
    sys.exit("no malloc_trim")
kept, freed = [], []
for _ in range(2000):  # 20 KB blocks (the C allocator's, not Python's small-object arenas) between others
    kept.append(bytes(700))
    freed.append(bytes(20_000))
del freed
before = rss_anon_kb()
trim(0)
print(before - rss_anon_kb())
"""


def test_glibc_malloc_trim_is_found_and_returns_free_pages() -> None:
    """On the image's C library (glibc, python:3.11-slim) the trimmer finds its function, and it does hand
    back what the heap freed."""
    done = subprocess.run([sys.executable, "-c", _TRIM], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert int(done.stdout) > 20_000  # KiB, of the 40 MB freed
