"""Server logs: one bounded JSON line per record, decisions with their keys, no objects, no tracebacks for bad HTTP."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import Pki, StartWebhook, Webhook
from tests.support import corpus_reviews, load_review
from webhook import logs, review
from webhook.server import keys
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
