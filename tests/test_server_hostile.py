"""Hostile input at the real TLS server: metric labels, Content-Encoding, sizes, bounded cost."""

from __future__ import annotations

import asyncio
import base64
import gzip
import json
import re
import threading
import zlib
from typing import Any

import pytest

from tests.conftest import Webhook
from tests.support import REPO, corpus_reviews, load_review
from webhook.server.limits import Limits, count_containers
from webhook.view.snapshot import EMPTY_VIEW
from webhook.server.metrics import REJECT_REASONS, Metrics


def pod_review() -> dict[str, Any]:
    return load_review(next(p for p in corpus_reviews() if "_create_pods_" in p.name and "dryrun" not in p.name))


async def scrape(webhook: Webhook) -> str:
    async with webhook.session.get(webhook.base + "/metrics") as resp:
        assert resp.status == 200
        return await resp.text()


def test_refusals_add_up_per_reason_and_a_reason_not_known_is_other() -> None:
    metrics = Metrics()
    for _ in range(3):
        metrics.reject("too-large")
    metrics.reject("Pod\udc00")  # no known reason: one bounded series, and /metrics still encodes
    text = metrics.render().decode()
    assert 'gpu_admission_rejected_requests_total{reason="too-large"} 3.0' in text
    assert 'gpu_admission_rejected_requests_total{reason="other"} 1.0' in text


def test_the_refusal_reasons_documented_are_the_ones_counted() -> None:
    text = " ".join((REPO / "docs" / "robustness.md").read_text().split())
    listed = re.search(r"`gpu_admission_rejected_requests_total\{reason\}` counts each refusal: (.*?); `", text)
    assert listed is not None
    assert set(re.findall(r"`([a-z-]+)`", listed.group(1))) == REJECT_REASONS


async def test_a_lone_surrogate_in_the_kind_leaves_metrics_working(webhook: Webhook) -> None:
    sent = pod_review()
    body = json.dumps(sent).replace('"kind": "Pod"', '"kind": "Pod\\udc00"', 1)
    assert "\\udc00" in body
    # not Unicode, so not a review kube-apiserver could send: refused with a Status, never a 500
    async with await webhook.post("/validate", body) as resp:
        assert resp.status == 400
        assert (await resp.json())["kind"] == "Status"
    await scrape(webhook)
    unknown = json.dumps(sent).replace('"kind": "Pod"', '"kind": "Pod\\u00e9"', 1)
    async with await webhook.post("/validate", unknown) as resp:
        assert resp.status == 200
        assert (await resp.json())["response"]["uid"] == sent["request"]["uid"]
    assert 'kind="other"' in await scrape(webhook)


async def test_request_fields_do_not_grow_the_metrics(webhook: Webhook) -> None:
    sent = pod_review()
    await webhook.review("/validate", sent)
    baseline = len(await scrape(webhook))
    for i in range(200):
        sent["request"]["kind"]["kind"] = f"Kind{i}"
        await webhook.review("/validate", sent)
    text = await scrape(webhook)
    assert "Kind1" not in text and 'kind="other"' in text
    assert len(text) < baseline + 2000, "each new kind must not add a time series"


def _bodies() -> dict[str, bytes]:
    raw = json.dumps(pod_review()).encode()
    deflated = zlib.compressobj(wbits=-zlib.MAX_WBITS)
    return {
        "gzip": gzip.compress(raw),
        "x-gzip": gzip.compress(raw),
        "deflate": zlib.compress(raw),
        "deflate-raw": deflated.compress(raw) + deflated.flush(),
        "identity": raw,
    }


@pytest.mark.parametrize("name", ["gzip", "x-gzip", "deflate", "deflate-raw", "identity"])
async def test_compressed_bodies_are_answered(webhook: Webhook, name: str) -> None:
    body = _bodies()[name]
    encoding = name.split("-")[0] if name != "x-gzip" else name
    async with await webhook.post("/mutate", body, headers={"Content-Encoding": encoding}) as resp:
        assert resp.status == 200, await resp.text()
        assert (await resp.json())["response"]["uid"] == pod_review()["request"]["uid"]


@pytest.mark.parametrize(
    ("encoding", "body", "status", "words"),
    [
        ("gzip", b'{"plain": "json"}', 400, "not valid gzip"),
        ("deflate", b"\x78\x9c\x00\x01garbage", 400, "not valid deflate"),
        ("gzip", gzip.compress(b"{}")[:-6], 400, "not complete"),
        ("br", b"{}", 415, "not supported"),
        ("gzip, gzip", b"{}", 415, "not supported"),
        ("zstd", b"{}", 415, "not supported"),
    ],
    ids=["plain-as-gzip", "garbage-deflate", "truncated-gzip", "brotli", "stacked", "zstd"],
)
async def test_bad_content_encoding_is_a_4xx_with_a_status(
    webhook: Webhook, encoding: str, body: bytes, status: int, words: str
) -> None:
    async with await webhook.post("/validate", body, headers={"Content-Encoding": encoding}) as resp:
        assert resp.status == status
        answer = await resp.json()
        assert answer["kind"] == "Status" and words in answer["message"]
    async with webhook.session.get(webhook.base + "/healthz") as resp:
        assert resp.status == 200


async def test_a_gzip_bomb_is_refused_and_its_connection_closed(webhook: Webhook) -> None:
    bomb = zlib.compressobj(9, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    body = bomb.compress(b"\0" * (64 * 1024 * 1024)) + bomb.flush()  # 64 MiB inflated, ~64 KiB sent
    async with await webhook.post("/validate", body, headers={"Content-Encoding": "gzip"}) as resp:
        assert resp.status == 413
        assert resp.headers.get("Connection", "").lower() == "close", "the rest of the body must not be read"
        assert "inflated request body is over" in (await resp.json())["message"]
    assert 'gpu_admission_rejected_requests_total{reason="too-large"} 1.0' in await scrape(webhook)


async def test_a_declared_length_over_the_limit_is_refused_before_reading(webhook: Webhook) -> None:
    body = b"x" * (Limits().max_body_bytes + 1)
    async with await webhook.post("/validate", body) as resp:
        assert resp.status == 413
        assert "over the" in (await resp.json())["message"]


def _many_containers(count: int) -> dict[str, Any]:
    sent = pod_review()
    template = sent["request"]["object"]["spec"]["containers"][0]
    sent["request"]["object"]["spec"]["containers"] = [{**template, "name": f"c{i}"} for i in range(count)]
    return sent


async def test_an_object_past_the_container_limit_is_answered_without_evaluation(webhook: Webhook) -> None:
    sent = _many_containers(Limits().max_containers + 1)
    validated = (await webhook.review("/validate", sent))["response"]
    assert validated["allowed"] is False and "at most 256" in validated["status"]["message"]
    mutated = (await webhook.review("/mutate", sent))["response"]
    assert mutated["allowed"] is True and "patch" not in mutated
    assert any("nothing was changed" in w for w in mutated["warnings"])
    assert 'gpu_admission_requests_total{decision="deny",endpoint="/validate"' in await scrape(webhook)


def test_containers_are_counted_where_pod_specs_list_them_and_what_they_carry_is_not_walked() -> None:
    """Every container list counts (pods, templates, init and ephemeral containers); a container's own
    fields are not searched: no kind nests containers there, and the engine never reads them as such."""
    carried = {"name": "c", "env": [{"name": f"E{i}", "value": "x"} for i in range(50)],
               "containers": [{"name": f"not-a-container-{i}"} for i in range(300)]}
    pod = {"kind": "Pod", "metadata": {"annotations": {"containers": "x"}},
           "spec": {"containers": [carried, {"name": "d"}], "initContainers": [{"name": "i"}],
                    "ephemeralContainers": [{"name": "e"}]}}
    job = {"kind": "CronJob", "spec": {"jobTemplate": {"spec": {"template": {"spec": {"containers": [carried] * 3}}}}}}
    assert count_containers(pod) == 4 and count_containers(job) == 3
    assert Limits().problem(pod) == ""


class _Witness:
    """The empty cluster view, noting the thread of each evaluation (each asks for the namespace)."""

    def __init__(self) -> None:
        self.threads: list[str] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(EMPTY_VIEW, name)

    def namespace(self, name: str) -> Any:
        self.threads.append(threading.current_thread().name)
        return EMPTY_VIEW.namespace(name)


async def test_objects_within_the_limit_are_evaluated_off_the_loop(start_webhook: Any) -> None:
    """A large body is evaluated by a worker thread, and answered as inline evaluation answers it."""
    sent = _many_containers(200)
    sent["request"]["object"]["metadata"]["annotations"] = {"padding": "x" * Limits().offload_bytes}
    answers, threads = {}, {}
    for how, limits in (("worker", Limits()), ("inline", Limits(offload_bytes=2**62))):
        witness = _Witness()
        hook = await start_webhook(view=witness, limits=limits)
        answers[how] = (await hook.review("/mutate", sent))["response"]
        threads[how] = witness.threads
    assert threads["worker"] and all(t.startswith("evaluate_") for t in threads["worker"]), threads
    assert threads["inline"] and set(threads["inline"]) == {threading.current_thread().name}, threads
    assert answers["worker"] == answers["inline"]
    answer = answers["worker"]
    assert answer["uid"] == sent["request"]["uid"] and answer["allowed"]
    ops = json.loads(base64.b64decode(answer["patch"]))
    assert ops, "the GPU pod is still mutated"


class _Gate(_Witness):
    """The witness, holding the evaluation of objects in namespace ``held`` until ``gate`` opens (5 s at most)."""

    def __init__(self) -> None:
        super().__init__()
        self.gate, self.entered = threading.Event(), threading.Event()

    def namespace(self, name: str) -> Any:
        if name == "held":
            self.entered.set()
            self.gate.wait(5.0)
        return super().namespace(name)


async def test_an_outsized_review_is_judged_off_the_loop_while_health_checks_and_small_reviews_are_answered(
    start_webhook: Any,
) -> None:
    view = _Gate()
    hook = await start_webhook(view=view)
    huge = _many_containers(200)
    huge["request"]["namespace"] = huge["request"]["object"]["metadata"]["namespace"] = "held"
    huge["request"]["object"]["metadata"]["annotations"] = {"padding": "x" * Limits().offload_bytes}
    judged = asyncio.ensure_future(hook.review("/mutate", huge))
    for _ in range(500):  # until its evaluation has begun (and is held)
        if view.entered.is_set():
            break
        await asyncio.sleep(0.01)
    assert view.entered.is_set()
    # held in a worker, it holds up neither the event loop's health checks nor small reviews
    async with hook.session.get(hook.base + "/healthz") as resp:
        assert resp.status == 200
    small = (await hook.review("/mutate", pod_review()))["response"]
    assert small["allowed"] and small["uid"] == pod_review()["request"]["uid"]
    assert not judged.done()
    view.gate.set()
    answer = (await judged)["response"]
    assert answer["allowed"] and answer["uid"] == huge["request"]["uid"] and "patch" in answer


async def test_past_the_deadline_validation_fails_closed_and_mutation_changes_nothing(start_webhook: Any) -> None:
    hook = await start_webhook(limits=Limits(deadline=0.0, offload_bytes=0))
    sent = pod_review()
    validated = (await hook.review("/validate", sent))["response"]
    assert validated["allowed"] is False and "longer than 0 s" in validated["status"]["message"]
    mutated = (await hook.review("/mutate", sent))["response"]
    assert mutated["allowed"] is True and "patch" not in mutated
    assert 'gpu_admission_requests_total{decision="warn",endpoint="/mutate"' in await scrape(hook)


async def test_a_patch_past_the_limit_is_dropped_with_a_warning(start_webhook: Any) -> None:
    hook = await start_webhook(limits=Limits(max_patch_bytes=10))
    sent = pod_review()
    sent["request"]["object"]["spec"]["tolerations"] = []
    response = (await hook.review("/mutate", sent))["response"]
    assert "patch" not in response and response["allowed"]
    assert "over the 10-byte limit" in response["warnings"][0]


def test_a_long_denial_message_is_cut_at_a_line_and_says_what_is_left_out() -> None:
    from webhook import review

    text = "\n".join(f"[p/r] violation number {n}" for n in range(2000))
    cut = review.limit_message(text)
    assert len(cut) <= review.MAX_MESSAGE_CHARS + 100
    assert cut.splitlines()[-2].startswith("[p/r] violation number") and "more line(s)" in cut.splitlines()[-1]
    shown = len(cut.splitlines()) - 1
    assert f"and {2000 - shown} more line(s)" in cut
    assert review.limit_message("short") == "short"


async def test_a_review_of_too_many_json_objects_is_refused_before_decoding(webhook: Webhook) -> None:
    sent = _many_containers(1)
    sent["request"]["object"]["spec"]["containers"] = [{"name": f"c{n}"} for n in range(Limits().max_objects + 1)]
    async with await webhook.post("/validate", sent) as resp:
        assert resp.status == 413
        assert "JSON objects" in (await resp.json())["message"]
    assert 'gpu_admission_rejected_requests_total{reason="too-many-objects"} 1.0' in await scrape(webhook)


def _with_variables(review: dict[str, Any], count: int) -> dict[str, Any]:
    """A real UPDATE review (kubectl applied the pod) whose container carries ``count`` more environment
    variables in both copies of the object, as kube-apiserver would send it: each in ``env``, in its
    managedFields entry and in the last-applied-configuration text."""
    review = json.loads(json.dumps(review))
    variables = [{"name": f"SETTING_{n}", "value": str(n)} for n in range(count)]
    for side in ("object", "oldObject"):
        obj = review["request"][side]
        container = obj["spec"]["containers"][0]
        container["env"] = [*container.get("env", []), *variables]
        fields = obj["metadata"]["managedFields"][0]["fieldsV1"]["f:spec"]["f:containers"]
        env = fields[f'k:{{"name":"{container["name"]}"}}']["f:env"]
        env.update({f'k:{{"name":"{v["name"]}"}}': {".": {}, "f:name": {}, "f:value": {}} for v in variables})
        applied = json.loads(obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"])
        applied["spec"]["containers"][0]["env"] = container["env"]
        obj["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = json.dumps(applied)
    return review


async def test_the_update_of_a_large_applied_pod_is_read(webhook: Webhook) -> None:
    """An UPDATE's review carries the object twice, each with its managedFields and (kubectl apply) itself
    again as text: a pod of 2,200 variables counts over 30,000 "{", which 20,000 refused (413: the update
    failed calling the webhook), while its CREATE was read."""
    [path] = [p for p in corpus_reviews() if p.name == "004_mutate_update_pods_.json"]
    sent = _with_variables(load_review(path), 2200)
    body = json.dumps(sent).encode()
    assert body.count(b"{") > 30_000  # past the 20,000 that refused it
    async with await webhook.post("/mutate", sent) as resp:
        assert resp.status == 200
        answer = (await resp.json())["response"]
    assert answer["uid"] == sent["request"]["uid"] and answer["allowed"]


@pytest.mark.parametrize("size", [1000, 63 * 1024, 64 * 1024, 64 * 1024 + 1, 300 * 1024])
def test_json_objects_are_counted_alike_below_and_above_the_size_counted_by_deleting(size: int) -> None:
    """Bodies have their "{" counted 64 KiB at a time until the count is past the limit, the rest
    another way: the same count, and the same refusal past the limit (a body of little but objects,
    as a hostile one is), wherever the limit falls."""
    from webhook.errors import RequestBodyError
    from webhook.server.handlers import _count_objects

    body = (b'[{"a":"{x"},' * size)[: size - 1] + b"]"
    assert _count_objects(body, 10**9) == body.count(b"{")
    dense = (b"{}," * size)[:size]
    with pytest.raises(RequestBodyError) as refused:
        _count_objects(dense, dense.count(b"{") - 1)
    assert refused.value.status == 413 and f"up to {dense.count(b'{')} JSON objects" in str(refused.value)
    assert _count_objects(dense, dense.count(b"{")) == dense.count(b"{")
    for limit in (0, 1000, 30_000):  # past the limit in the first chunk, or a later one
        if dense.count(b"{") > limit:
            with pytest.raises(RequestBodyError) as refused:
                _count_objects(dense, limit)
            assert f"up to {dense.count(b'{')} JSON objects" in str(refused.value)
