"""Shared test helpers: corpus locations, schema validation, patch checks."""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from functools import lru_cache
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import jsonpatch
import kubernetes_validate
import pytest

if TYPE_CHECKING:
    from webhook.policy.loader import PolicySet

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("GPU_ADMISSION_SHARED", REPO.parent / "shared"))
CORPUS = SHARED / "corpus"
REVIEWS = CORPUS / "admissionreviews" / "kube-apiserver-1.36"
MANIFESTS = CORPUS / "manifests"
POLICIES = REPO / "policies"
K8S_VERSION = "1.34"

#: a namespace cap of 4 GPUs (no ResourceQuotas), the ledger tests' and the DRA holding tests' policy
NAMESPACE_CAP_OF_4 = """\
apiVersion: gpu-admission.io/v1alpha1
kind: GPUPolicy
metadata: {name: caps}
spec:
  rules: {quota: {resourceQuotas: false, limits: [{scope: namespace, max: 4}]}}
"""


def cap_of_4_policies() -> PolicySet:
    """The shipped workload kinds and :data:`NAMESPACE_CAP_OF_4`, loaded."""
    from webhook.policy import loader

    return loader.load_text((POLICIES / "workload-kinds.yaml").read_text() + "\n---\n" + NAMESPACE_CAP_OF_4)


#: YAML values that their explicit tag does not fit, and the error PyYAML's safe constructor raises on each
TAG_MISFITS = [
    ("!!int abc", "ValueError: invalid literal for int() with base 10: 'abc'"),
    ("!!bool maybe", "KeyError: 'maybe'"),
]

#: kinds whose OpenAPI schema kubernetes-validate ships
BUILTIN_GROUPS = {"v1", "apps/v1", "batch/v1"}


def corpus_reviews() -> list[Path]:
    files = sorted(REVIEWS.glob("*.json"))
    assert files, f"no AdmissionReview corpus at {REVIEWS} (set GPU_ADMISSION_SHARED)"
    return files


def load_review(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def apply_patch(obj: Any, ops: Any) -> Any:
    """Apply an RFC 6902 patch as kube-apiserver would, to a copy: the patch as JSON text
    (jsonpatch inserts its values as they are, and the engine's patches may hold one value
    at several paths)."""
    return jsonpatch.JsonPatch(json.loads(json.dumps(list(ops)))).apply(copy.deepcopy(obj))


def assert_same_in_place(policies: Any, request: Any, view: Any, phase: Any, decision: Any) -> None:
    """Evaluated in place (the server's way: rules write into the request's object), a copy of the
    request gets the same decision as the copying evaluation gave: operations, messages, document."""
    from dataclasses import replace

    from webhook.policy import engine

    mine = replace(request, object=_as_parsed(request.object), old_object=_as_parsed(request.old_object))
    in_place = engine.evaluate(policies, mine, view, phase, True)
    assert list(in_place.patch) == list(decision.patch)
    assert in_place == decision


def _as_parsed(obj: Any) -> Any:
    """A copy of ``obj`` as the server has it, parsed from JSON: a tree (YAML anchors and generated
    objects can share a map between two places; JSON text cannot). Deep-copied when it holds what
    JSON has not (a YAML date)."""
    try:
        return json.loads(json.dumps(obj))
    except (TypeError, ValueError):
        return copy.deepcopy(obj)


def assert_schema_valid(obj: dict[str, Any]) -> None:
    """Strict OpenAPI validation of built-in kinds, and of the pod templates inside custom resources.

    kubernetes-validate knows no custom resource, so a custom kind's templates (where the
    shipped GPUWorkloadKind policies say its kind keeps them) are validated as the
    PodTemplateSpecs they are, strictly; pod specs inlined among a component's own fields
    (KServe's ``podSpecs``) as PodSpecs, with those other fields let through (so a misspelt pod
    field there goes unseen; a value of the wrong shape does not). Other custom
    resources are ones the engine does not look inside, so it writes nothing there to check."""
    if obj.get("apiVersion") in BUILTIN_GROUPS:
        # server-populated metadata is not part of what a client may send
        clean = dict(obj)
        clean["metadata"] = {k: v for k, v in obj.get("metadata", {}).items() if k != "managedFields"}
        clean.pop("status", None)
        _validate(clean, str(obj.get("kind")), strict=True)
        return
    from webhook.kube.patch import lookup
    from webhook.kube.workload import pod_targets

    group = str(obj.get("apiVersion", "")).rpartition("/")[0]
    paths = shipped_policies().kinds.get((group, str(obj.get("kind"))))
    for target in pod_targets(obj, paths) if paths is not None else ():
        where = f"{obj.get('kind')} {target.where()}"
        if target.meta_path is not None:
            template = lookup(obj, target.spec_path[:-1])
            _validate({"apiVersion": "v1", "kind": "PodTemplate", "metadata": {"name": "template"},
                       "template": template}, where, strict=True)
        else:  # a component may name a model instead of containers: none is needed there
            spec = {"containers": [], **lookup(obj, target.spec_path)}
            _validate({"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "pod"}, "spec": spec},
                      where, strict=False)


def _validate(obj: dict[str, Any], what: str, strict: bool) -> None:
    try:
        kubernetes_validate.validate(obj, K8S_VERSION, strict=strict)
    except kubernetes_validate.ValidationError as exc:
        raise AssertionError(f"{what} is not schema-valid: {str(exc).splitlines()[0]}") from exc


def unavailable(reason: str) -> NoReturn:
    """Skip a test for want of something the repository installs where it can (``reason`` says
    what and how); where the whole suite must run (``GPU_ADMISSION_E2E=required``, as .ci/run
    sets), fail instead: a test that skips in CI proves nothing."""
    if os.environ.get("GPU_ADMISSION_E2E") == "required":
        pytest.fail(f"required (GPU_ADMISSION_E2E=required) but: {reason}", pytrace=False)
    pytest.skip(reason)


@lru_cache(maxsize=None)
def shipped_policies() -> Any:
    from webhook.policy import loader

    return loader.load_directory(POLICIES)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    return free_ports(1)[0]


def free_ports(count: int) -> list[int]:
    """``count`` distinct such ports: held open together while picked, so none comes twice."""
    socks = [socket.socket() for _ in range(count)]
    try:
        for sock in socks:
            sock.bind(("127.0.0.1", 0))
        return [int(sock.getsockname()[1]) for sock in socks]
    finally:
        for sock in socks:
            sock.close()


def listening_port(process: subprocess.Popen[bytes], timeout: float = 30.0) -> int:
    """The TCP port ``process`` listens on, once it does (Linux: its socket inodes in /proc/net/tcp).

    A server started with ``--port 0`` binds a port the kernel picks: no other process can take
    it between being picked and being bound, as one picked beforehand (``free_port``) can be."""
    return min(listening_ports(process, 1, timeout))


def listening_ports(process: subprocess.Popen[bytes], count: int, timeout: float = 30.0) -> set[int]:
    """The TCP ports ``process`` listens on, once there are ``count`` (Linux: /proc)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert process.poll() is None, f"the server exited with {process.returncode} before it listened"
        inodes = set()
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{process.pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{process.pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
        ports = set()
        for table in ("/proc/net/tcp", "/proc/net/tcp6"):
            with contextlib.suppress(OSError), open(table) as lines:
                next(lines)
                for line in lines:
                    fields = line.split()
                    if fields[3] == "0A" and fields[9] in inodes:  # LISTEN
                        ports.add(int(fields[1].rsplit(":", 1)[1], 16))
        if len(ports) >= count:
            return ports
        time.sleep(0.05)
    raise AssertionError(f"the server did not listen on {count} port(s) within {timeout:g} s")


def send_json(handler: BaseHTTPRequestHandler, payload: Any, status: int = 200) -> None:
    """Answer an http.server request with a JSON body (test stand-ins for servers we talk to)."""
    body = json.dumps(payload).encode()
    handler.send_response(status)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def invalid_policies(folder: Path) -> Path:
    """The shipped policies copied to ``folder`` with one field made invalid: gpu-defaults.yaml's first ``mode``."""
    shutil.copytree(POLICIES, folder)
    shipped = folder / "gpu-defaults.yaml"
    shipped.write_text(shipped.read_text().replace("mode: enforce", "mode: sometimes", 1))
    return folder


def break_the_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """A bug in the engine: the one thing no real input may cause, so it is simulated."""
    from webhook.policy import engine

    def broken(*args: object) -> None:
        raise RuntimeError("a bug")

    monkeypatch.setattr(engine, "evaluate", broken)


def assert_crashed(command: Callable[..., tuple[int, str, str]]) -> None:
    """``command(*extra_args)`` (exit code, stdout, stderr) ends on an engine broken by ``break_the_engine``
    as a CLI command must: exit 3 and one line, and with ``--debug`` the traceback before it."""
    assert command() == (3, "", "error: unexpected RuntimeError: a bug (--debug for the traceback)\n")
    code, _, err = command("--debug")
    assert code == 3 and "Traceback (most recent call last)" in err and err.endswith("error: unexpected RuntimeError: a bug\n")


#: (path, thread) of each file opened for reading and each folder listed below the watched places
_reads: list[tuple[str, int]] | None = None
_watched: tuple[str, ...] = ()


def _record(event: str, args: tuple[object, ...]) -> None:
    """An audit hook (PEP 578): Python itself reports every open() and folder listing, on the thread doing it."""
    if _reads is None or event not in ("open", "os.scandir", "os.listdir") or not args:
        return
    path, mode = str(args[0]), args[1] if event == "open" and len(args) > 1 else "r"
    if path.startswith(_watched) and not (isinstance(mode, str) and any(c in mode for c in "wax+")):
        _reads.append((path, threading.get_ident()))


@contextlib.contextmanager
def file_reads(*places: Path) -> Iterator[list[tuple[str, int]]]:
    """The reads (path, thread) below ``places`` (folders or files) while inside.

    An audit hook cannot be removed: it is installed once and idles after."""
    global _reads, _watched
    if not getattr(sys, "_gpu_admission_read_hook", False):
        sys.addaudithook(_record)
        sys._gpu_admission_read_hook = True  # type: ignore[attr-defined]
    _reads, _watched = [], tuple(str(p) for p in places)
    try:
        yield _reads
    finally:
        _reads = None
