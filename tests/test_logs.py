"""Server logs: one bounded JSON line per record, decisions with their keys, no objects, no tracebacks for bad HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import pty
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.conftest import Pki, StartWebhook, Webhook
from tests.support import REPO, corpus_reviews, listening_port, load_review
from webhook import log_line, logs, review
from webhook.policy.decision import Decision
from webhook.policy.finding import Finding
from webhook.server import handlers, keys
from webhook.view.snapshot import SnapshotView


def render(record: logging.LogRecord) -> dict[str, object]:
    line = logs.JsonFormatter().format(record)
    assert "\n" not in line and line.isascii()
    return dict(json.loads(line))


def test_a_record_is_one_bounded_ascii_json_line() -> None:
    record = logging.makeLogRecord({"msg": "Pod\udc00 " + "x" * 10_000, "levelname": "INFO", "uid": "u-1"})
    entry = render(record)
    assert entry["uid"] == "u-1" and entry["level"] == "info"
    assert len(str(entry["msg"])) < logs.MAX_MESSAGE_CHARS + 100


def test_the_text_format_survives_a_lone_surrogate() -> None:
    record = logging.makeLogRecord({"msg": "kind %s", "args": ("Pod\udc00",), "levelname": "INFO"})
    assert "\\udc00" in logs.TextFormatter().format(record)


async def test_decisions_are_logged_with_their_keys_and_never_the_object(webhook: Webhook, caplog: pytest.LogCaptureFixture) -> None:
    sent = load_review(next(p for p in corpus_reviews() if "validate_create_pods" in p.name))
    container = sent["request"]["object"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"nvidia.com/gpu": "0.5"}}
    container["env"] = [{"name": "TOKEN", "value": "s3cr3t-value"}]
    with caplog.at_level(logging.INFO, logger="webhook"):
        assert not (await webhook.review("/validate", sent))["response"]["allowed"]
    (record,) = [r for r in caplog.records if r.name == "webhook.server.handlers"]
    entry = render(record)
    req = sent["request"]
    assert entry["uid"] == req["uid"] and entry["kind"] == "Pod" and entry["verdict"] == "deny"
    assert entry["namespace"] == req["namespace"] and "gpu-validations/resourceShape" in entry["rules"]  # type: ignore[operator]
    assert "s3cr3t-value" not in json.dumps(entry)


async def test_malformed_http_is_one_short_line_without_traceback(webhook: Webhook, pki: Pki, caplog: pytest.LogCaptureFixture) -> None:
    port = int(webhook.base.rsplit(":", 1)[1])
    with caplog.at_level(logging.DEBUG, logger="aiohttp"):
        for garbage in (b"GET /healthz HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n", b"\x00\x01 nonsense\r\n\r\n"):
            reader, writer = await asyncio.open_connection("127.0.0.1", port, ssl=pki.client_context(), server_hostname="localhost")
            writer.write(garbage)
            answer = await asyncio.wait_for(reader.read(), 5)
            head, _, body = answer.partition(b"\r\n\r\n")
            assert b" 400 " in head.split(b"\r\n")[0] and json.loads(body)["kind"] == "Status"
            writer.close()
    server = [r for r in caplog.records if r.name == "aiohttp.server"]
    assert server, "each malformed request is logged"
    for record in server:
        assert record.levelno <= logging.INFO and record.exc_info is None
        assert record.getMessage().startswith("malformed HTTP request from") and len(record.getMessage()) < 300


async def test_an_audit_finding_is_logged_at_info_and_answered_with_an_audit_annotation(
    start_webhook: StartWebhook, tmp_path: Path, caplog: pytest.LogCaptureFixture,
) -> None:
    # an operator trying a rule in audit mode before enforcing it must see which objects it would refuse
    policies = tmp_path / "audit-policies"
    policies.mkdir()
    (policies / "shape.yaml").write_text(
        "apiVersion: gpu-admission.io/v1alpha1\nkind: GPUPolicy\nmetadata: {name: shape-audit}\n"
        "spec: {match: {kinds: ['*']}, rules: {resourceShape: {mode: audit}}}\n"
    )
    hook = await start_webhook(policies)
    sent = load_review(next(p for p in corpus_reviews() if "validate_create_pods" in p.name))
    container = sent["request"]["object"]["spec"]["containers"][0]
    container["resources"] = {"limits": {"nvidia.com/gpu": "0.5"}}
    container["env"] = [{"name": "TOKEN", "value": "s3cr3t-value"}]
    with caplog.at_level(logging.INFO, logger="webhook"):
        response = (await hook.review("/validate", sent))["response"]
    assert response["allowed"] and "warnings" not in response
    (finding,) = json.loads(response["auditAnnotations"][review.AUDIT_ANNOTATION])
    assert finding.startswith("[shape-audit/resourceShape] ")
    (record,) = [r for r in caplog.records if r.name == "webhook.server.handlers"]
    entry = render(record)
    req = sent["request"]
    assert entry["level"] == "info" and entry["verdict"] == "audit" and entry["rules"] == ["shape-audit/resourceShape"]
    assert entry["uid"] == req["uid"] and entry["kind"] == "Pod" and entry["endpoint"] == "/validate"
    assert entry["namespace"] == req["namespace"] and entry["object"] == req["name"]
    assert finding in str(entry["msg"]) and "s3cr3t-value" not in json.dumps(entry)


async def test_an_admission_without_findings_gets_no_audit_annotation_nor_info_line(
    webhook: Webhook, caplog: pytest.LogCaptureFixture,
) -> None:
    sent = load_review(next(p for p in corpus_reviews() if "validate_create_pods" in p.name))
    with caplog.at_level(logging.INFO, logger="webhook"):
        response = (await webhook.review("/validate", sent))["response"]
    assert response["allowed"] and "auditAnnotations" not in response
    assert not [r for r in caplog.records if r.name == "webhook.server.handlers"]


@pytest.mark.parametrize(("level", "shown"), [("INFO", False), ("DEBUG", True)])
def test_urllib3_retry_lines_show_only_when_debugging(level: str, shown: bool) -> None:
    # while the API server is away the client retries each call and urllib3 says so at WARNING,
    # three lines a second besides the watch's own; a separate process: configure() is global
    code = (
        "import logging\nfrom webhook import logs\n"
        f"logs.configure({level!r}, 'text')\n"
        "logging.getLogger('urllib3.connectionpool').warning('Retrying (Retry(total=2)) after connection broken')\n"
        "logging.getLogger('webhook.cluster.watch').warning('pods: watch failed, retrying in 1.0 s')\n"
    )
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "watch failed" in err
    assert ("Retrying (Retry" in err) is shown, err


async def test_a_note_is_no_audit_finding_nor_info_line_nor_audit_metric(
    start_webhook: StartWebhook, caplog: pytest.LogCaptureFixture,
) -> None:
    # a GPU pod on a cluster where the webhook sees no GPU node: cudaDriver notes it checked no driver
    view = SnapshotView.from_objects([{"kind": "Node", "metadata": {"name": "cpu-1"}, "status": {"allocatable": {"cpu": "8"}}}])
    hook = await start_webhook(view=view)
    sent = load_review(next(p for p in corpus_reviews() if "validate_create_pods" in p.name))
    container = sent["request"]["object"]["spec"]["containers"][0]
    container["image"] = "nvidia/cuda:12.6.3-runtime-ubuntu22.04"
    container["resources"] = {"limits": {"nvidia.com/gpu": "1"}}
    with caplog.at_level(logging.INFO, logger="webhook"):
        response = (await hook.review("/validate", sent))["response"]
    assert response["allowed"] and "auditAnnotations" not in response, response
    assert not [r for r in caplog.records if r.name == "webhook.server.handlers"]
    with caplog.at_level(logging.DEBUG, logger="webhook"):
        await hook.review("/validate", sent)
    assert "gpu-validations/cudaDriver" in json.dumps([render(r) for r in caplog.records]), "the note was there"
    assert 'rule="cudaDriver"' not in hook.app[keys.METRICS].render().decode()


def _denied_review(containers: int) -> dict[str, Any]:
    """A pod review that /validate denies with a long message: ``containers`` containers asking for half a GPU."""
    sent = load_review(next(p for p in corpus_reviews() if "validate_create_pods" in p.name))
    spec = sent["request"]["object"]["spec"]
    spec["containers"] = [
        {"name": f"worker-{i}", "image": "nginx:1.27", "resources": {"limits": {"nvidia.com/gpu": "0.5"}}}
        for i in range(containers)
    ]
    return sent


def _dropped(metrics: str) -> float:
    found = re.search(r"^gpu_admission_log_lines_dropped_total (\S+)$", metrics, re.MULTILINE)
    assert found, "the server exports its dropped log lines"
    return float(found.group(1))


async def test_a_stalled_log_reader_costs_log_lines_never_answers(pki: Pki, policy_dir: Path) -> None:
    """stdout and stderr on a pipe nobody reads (a stalled log shipper): once the pipe (64 KiB) and
    the server's log buffer are full, its lines are dropped and counted, and it keeps answering
    admissions and /healthz; once the pipe is read again, one line says how many were dropped."""
    read_end, write_end = os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "webhook", "--log-level", "INFO", "serve", "--no-cluster", "--host", "127.0.0.1",
         "--port", "0", "--policies", str(policy_dir), "--tls-cert", str(pki.cert), "--tls-key", str(pki.key)],
        cwd=REPO, stdout=write_end, stderr=write_end,
    )
    os.close(write_end)
    try:
        base = f"https://127.0.0.1:{listening_port(proc)}"
        body = json.dumps(_denied_review(20)).encode()
        connector = aiohttp.TCPConnector(ssl=pki.client_context(), limit=8)
        # (a bound for a hang, not a speed: an answer takes milliseconds, unless the server is stalled)
        async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=60)) as session:

            async def get(path: str) -> str:
                async with session.get(base + path) as resp:
                    assert resp.status == 200, path
                    return await resp.text()

            async def denials(count: int) -> None:
                async def one() -> None:
                    async with session.post(base + "/validate", data=body, headers={"Content-Type": "application/json"}) as resp:
                        assert resp.status == 200 and not (await resp.json())["response"]["allowed"]

                await asyncio.gather(*(one() for _ in range(count)))

            for _ in range(300):  # the server comes up; its first lines go into the pipe
                with contextlib.suppress(aiohttp.ClientError):
                    if await get("/readyz"):
                        break
                await asyncio.sleep(0.05)
            for _ in range(40):  # a denial is a ~2.5 KB line: a few hundred fill the pipe and the buffer
                await denials(100)
                if _dropped(await get("/metrics")) > 0:
                    break
            stalled = _dropped(await get("/metrics"))
            assert stalled > 0, "the lines that did not fit were dropped"
            # still stalled: the server answers as before, and its lines keep being dropped
            assert await get("/healthz") == "ok\n"
            await denials(50)
            dropped = _dropped(await get("/metrics"))
            assert dropped >= stalled + 50
        output = await asyncio.wait_for(asyncio.to_thread(_read_until, read_end, b"log lines dropped"), 60)
        proc.send_signal(signal.SIGTERM)
        assert await asyncio.to_thread(proc.wait, 60) == 0
        output += await asyncio.wait_for(asyncio.to_thread(_read_until, read_end, None), 60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        os.close(read_end)
    lines = [json.loads(line) for line in output.decode().splitlines()]
    notices = [line for line in lines if "dropped" in line]
    assert notices and sum(n["dropped"] for n in notices) == dropped, notices
    assert notices[0]["msg"].startswith(f"{notices[0]['dropped']} log lines dropped: the log output (stderr) did not take")
    assert lines[-1]["msg"] == "stopped"


def _read_until(fd: int, marker: bytes | None) -> bytes:
    """What ``fd`` gives until ``marker`` has come and a line has ended after it (``None``: until its end)."""
    data = b""
    while True:
        chunk = os.read(fd, 1 << 16)
        data += chunk
        if not chunk or (marker is not None and marker in data and data.endswith(b"\n")):
            return data


async def _served(pki: Pki, policy_dir: Path, flags: tuple[str, ...], mutated: list[dict[str, Any]], denied: dict[str, Any],
                  terminal: bool = False) -> tuple[str, list[dict[str, Any]]]:
    """What `serve` (with ``flags``, its output a pipe or a terminal) writes by the time it has logged the
    denial of ``denied`` on /validate, sent after each of ``mutated`` on /mutate; and their answers."""
    read_end, write_end = pty.openpty() if terminal else os.pipe()
    proc = subprocess.Popen(
        [sys.executable, "-m", "webhook", "serve", "--no-cluster", "--host", "127.0.0.1", "--port", "0",
         "--policies", str(policy_dir), "--tls-cert", str(pki.cert), "--tls-key", str(pki.key), *flags],
        cwd=REPO, stdout=write_end, stderr=write_end,
    )
    os.close(write_end)
    answers = []
    try:
        base = f"https://127.0.0.1:{listening_port(proc)}"
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=pki.client_context())) as session:
            for sent in mutated:
                async with session.post(base + "/mutate", json=sent) as resp:
                    answers.append((await resp.json())["response"])
            async with session.post(base + "/validate", json=denied) as resp:
                assert not (await resp.json())["response"]["allowed"]
        output = await asyncio.wait_for(asyncio.to_thread(_read_until, read_end, b"deny: "), 60)
    finally:
        proc.kill()
        proc.wait()
        os.close(read_end)
    return output.decode(), answers


@pytest.mark.parametrize(("terminal", "flags", "text"), [(False, (), False), (True, (), True), (True, ("--log-format", "json"), False)],
                         ids=["file", "terminal", "terminal-asked-json"])
async def test_serve_writes_json_lines_off_a_terminal_and_text_lines_on_one(
    pki: Pki, policy_dir: Path, terminal: bool, flags: tuple[str, ...], text: bool,
) -> None:
    """The line per admission as `serve` writes it (without a LogRecord): the same keys in both formats."""
    sent = _denied_review(1)
    output, _ = await _served(pki, policy_dir, flags, [], sent, terminal)
    req = sent["request"]
    line = next(line for line in output.splitlines() if "deny: " in line)
    if text:
        assert re.fullmatch(
            rf"\d{{4}}-\d\d-\d\d \d\d:\d\d:\d\d,\d{{3}} INFO webhook\.server\.handlers: deny: \[gpu-validations/resourceShape\] .* "
            rf"\[uid={req['uid']} kind=Pod operation=CREATE namespace={req['namespace']} object={req['name']} "
            rf"endpoint=/validate verdict=deny rules=gpu-validations/resourceShape\]",
            line.rstrip("\r"),
        ), line
    else:
        entry = json.loads(line)
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}\+00:00", entry.pop("time"))
        assert entry.pop("msg").startswith("deny: [gpu-validations/resourceShape] Pod ")
        assert entry == {
            "level": "info", "logger": "webhook.server.handlers", "uid": req["uid"], "kind": "Pod", "operation": "CREATE",
            "namespace": req["namespace"], "object": req["name"], "endpoint": "/validate", "verdict": "deny",
            "rules": ["gpu-validations/resourceShape"],
        }


@pytest.mark.parametrize("flags", [(), ("--log-mutations",)], ids=["as shipped", "--log-mutations"])
async def test_a_patch_is_a_line_at_info_only_with_log_mutations(pki: Pki, policy_dir: Path, flags: tuple[str, ...]) -> None:
    """As Gatekeeper: a patched admission is logged at INFO only when asked (the object names what changed
    in its provenance annotation); a denial always is. The patch is sent first, the denial after it: the
    writer keeps their order, so the patch's line, when there is one, comes before the denial's."""
    patched = load_review(next(p for p in corpus_reviews() if "mutate_create_pods" in p.name))
    output, (answer,) = await _served(pki, policy_dir, flags, [patched], _denied_review(1))
    assert answer["allowed"] and answer["patch"], "the shipped policies patch this GPU pod"
    decisions = [json.loads(line) for line in output.splitlines() if '"verdict"' in line]
    assert [(d["level"], d["verdict"]) for d in decisions] == [("info", "patch")] * bool(flags) + [("info", "deny")]
    if flags:
        req = patched["request"]
        assert decisions[0]["uid"] == req["uid"] and decisions[0]["endpoint"] == "/mutate"
        assert decisions[0]["msg"].startswith("patch: ")


@pytest.mark.parametrize("mutations", [False, True])
@pytest.mark.parametrize("findings", [(), (Finding("shape-audit", "resourceShape", "audit", "fractional GPUs"),)],
                         ids=["no findings", "an audit finding"])
def test_the_level_of_a_patch_line(caplog: pytest.LogCaptureFixture, mutations: bool, findings: tuple[Finding, ...]) -> None:
    """A patch: INFO with --log-mutations or beside an audit-mode finding (the operator trying the rule reads
    it), DEBUG otherwise; its verdict stays "patch"."""
    parsed = review.parse_review(json.dumps(_denied_review(1)))
    decision = Decision(allowed=True, patch=({"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"},),
                        findings=findings)
    with caplog.at_level(logging.DEBUG, logger="webhook"):
        handlers.log_decision(None, "/mutate", parsed, decision, "patch", mutations)
    (record,) = [r for r in caplog.records if r.name == "webhook.server.handlers"]
    assert record.levelno == (logging.INFO if mutations or findings else logging.DEBUG)
    assert render(record)["verdict"] == "patch"


_FINDINGS = (
    Finding("gpu-validations", "resourceShape", "enforce", "fractional GPUs: " + "0.5 " * 700),  # past the message's cut
    Finding("gpu-validations", "cudaDriver", "audit", "CUDA 13.0 needs driver \udc00 580"),  # a lone surrogate
    Finding("gpu-defaults", "shm", "enforce", "/dev/shm added", note="pass"),
)


@pytest.mark.parametrize("outcome", ["patch", "deny", "error", "audit", "warn", "allow"])
@pytest.mark.parametrize("findings", [(), _FINDINGS], ids=["no findings", "findings"])
def test_the_line_per_admission_is_the_line_its_fields_make(outcome: str, findings: tuple[Finding, ...]) -> None:
    """The line per admission is made in one piece (log_line.decision_line); byte for byte what the
    formatter makes of its fields, in every outcome, with a message past the cut and one that orjson refuses."""
    parsed = review.parse_review(json.dumps(_denied_review(1)))
    decision = Decision(allowed=outcome not in ("deny", "error"), warnings=("gpu-admission mutated: shm", "\udc00"),
                        findings=findings)
    when = logs.JsonFormatter().clock.text(1_790_000_000.25)
    line = log_line.decision_line(when, "info", "webhook.server.handlers", "/validate", parsed, decision, outcome)
    text, fields = log_line.decision_fields("/validate", parsed, decision, outcome)
    assert line == log_line.json_line(when, "info", "webhook.server.handlers", f"{outcome}: {text}", fields)
    entry = json.loads(line)
    assert line.endswith(b"\n") and entry["verdict"] == outcome and entry["uid"] == parsed.uid
    assert entry["rules"] == (["gpu-defaults/shm", "gpu-validations/cudaDriver", "gpu-validations/resourceShape"] if findings else [])


@pytest.mark.parametrize("formatter", [logs.JsonFormatter, logs.TextFormatter])
def test_a_record_that_cannot_be_formatted_is_a_line_saying_so(formatter: type[logs.JsonFormatter] | type[logs.TextFormatter]) -> None:
    # logging's own handlers print a traceback to stderr itself, with a blocking write: this one never does
    read_end, write_end = os.pipe()
    output = logs.Output(formatter(), write_end)
    try:
        record = logging.makeLogRecord({"name": "webhook.x", "msg": "%d items", "args": ("many",), "levelname": "INFO"})
        output.handle(record)
        output.flush()
        line = os.read(read_end, 1 << 16).decode()
    finally:
        output.close()
        os.close(read_end)
        os.close(write_end)
    assert line.count("\n") == 1 and "unformattable log record: TypeError: %d format" in line and "%d items" in line, line
