"""Values nested a thousand levels deep (valid JSON, which orjson reads) are judged as the malformed values they are.

``str()`` or ``repr()`` of a list nested ~1,000 levels deep raises
RecursionError; where the engine wrote a quantity, an annotation, a name or
a label value into a message or compared it as text, a review carrying such
a value got an "internal error" answer (or a 500 from the review's own
checks). ``webhook.kube.value_text`` writes lists and maps without
recursion, cut short.
"""

from __future__ import annotations

import copy
import json
import sys
from collections.abc import Iterator
from typing import Any

import orjson
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tests.conftest import Webhook
from tests.support import corpus_reviews, load_review
from tests.test_cases import _load_cases, _policies
from webhook import review
from webhook.errors import UnreadableReview
from webhook.kube import value_text
from webhook.policy import engine
from webhook.policy.request import Request
from webhook.view.snapshot import SnapshotView

#: as deep as orjson reads a review (1,024 levels in all) with the value a dozen levels down
DEPTH = 1000
DEEP_LIST = "[" * DEPTH + "]" * DEPTH
DEEP_MAP = '{"a":' * DEPTH + "1" + "}" * DEPTH



@pytest.fixture(autouse=True)
def _default_recursion_limit() -> Iterator[None]:
    """Python's default limit, as `serve` runs: cel-python, which another test module loads, sets 2,500 for
    the whole process, and under it str() of these values recurses without an error."""
    before = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)
    yield
    sys.setrecursionlimit(before)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=12),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=12,
)


@given(json_values)
def test_a_value_reads_as_str_and_repr_do_up_to_its_cut(value: Any) -> None:
    for ours, theirs in ((value_text.text(value), str(value)), (value_text.shown(value), repr(value))):
        if not isinstance(value, (list, dict)) or len(theirs) <= value_text.MAX_CHARS:
            assert ours == theirs
        else:
            assert ours == theirs[: value_text.MAX_CHARS] + "…"


@pytest.mark.parametrize("deep", [DEEP_LIST, DEEP_MAP], ids=["list", "map"])
def test_a_deep_value_reads_without_recursion(deep: str) -> None:
    value = orjson.loads(deep)
    with pytest.raises(RecursionError):
        str(value)
    assert value_text.text(value) == value_text.shown(value) == (
        "[" * value_text.MAX_CHARS if deep == DEEP_LIST else ("{'a': " * 14)[: value_text.MAX_CHARS]) + "…"


def _paths(node: Any, path: tuple[str | int, ...] = ()) -> Iterator[tuple[str | int, ...]]:
    if path:
        yield path
    items = node.items() if isinstance(node, dict) else enumerate(node) if isinstance(node, list) else ()
    for key, value in items:
        yield from _paths(value, (*path, key))


def _with(obj: dict[str, Any], path: tuple[str | int, ...], value: Any) -> dict[str, Any]:
    changed = copy.deepcopy(obj)
    node: Any = changed
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = value
    return changed


@pytest.mark.parametrize(("suite", "case"), [p.values for p in _load_cases()], ids=[p.id for p in _load_cases()])
def test_every_field_of_every_golden_case_may_hold_a_deep_value(suite: dict[str, Any], case: dict[str, Any]) -> None:
    """Each field of the case's object in turn replaced by a deep list, then a deep map: both phases
    evaluate (every rule of the case's policies reads what it reads) and answer."""
    policies = _policies(suite, case)
    view = SnapshotView.from_objects(case.get("cluster", suite.get("cluster", [])), known=case.get("known", ()))
    deep = [orjson.loads(DEEP_LIST), orjson.loads(DEEP_MAP)]
    for path in _paths(case["object"]):
        for value in deep:
            obj = _with(case["object"], path, value)
            request = Request.for_object(obj, operation=case.get("operation", "CREATE"), namespace=case.get("namespace"))
            for phase in ("mutate", "validate"):
                decision = engine.evaluate(policies, request, view, phase)
                answer = review.build_response(review.Review("admission.k8s.io/v1", "u", request), decision, mutating=phase == "mutate")
                assert len(review.encode(answer)) < 64_000, path


def _review(path: tuple[str | int, ...], deep: str) -> bytes:
    """The corpus's GPU pod (validate, CREATE), the field at ``path`` of its object holding ``deep``."""
    sent = load_review(next(p for p in corpus_reviews() if "validate_create_pods" in p.name))
    obj = sent["request"]["object"]
    obj["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}, "requests": {"nvidia.com/gpu": "1"}}
    # a value the GPU-access rule reads (and, as "void", admits on a GPU container): a deep one is judged there
    obj["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]
    return json.dumps(_with(sent, ("request", "object", *path), "@deep@")).replace('"@deep@"', deep).encode()


@pytest.mark.parametrize("deep", [DEEP_LIST, DEEP_MAP], ids=["list", "map"])
@pytest.mark.parametrize(("path", "found"), [
    (("spec", "containers", 0, "resources", "limits", "nvidia.com/gpu"), "nvidia.com/gpu: {} is not a valid quantity"),
    (("spec", "containers", 0, "resources", "requests", "nvidia.com/gpu"), "nvidia.com/gpu: {} is not a valid quantity"),
    (("metadata", "annotations", "gpu-admission.io/cuda-version"), "annotation gpu-admission.io/cuda-version"),
    (("spec", "containers", 0, "image"), "its image is not a valid image reference"),
    (("spec", "containers", 0, "env", 0, "value"), ""),
    (("metadata", "labels", "gpu-admission.io/workload-class"), ""),
    (("metadata", "generateName"), ""),
], ids=["gpu-limit", "gpu-request", "cuda-annotation", "image", "env-value", "label", "generate-name"])
async def test_the_server_judges_a_deep_value_as_the_malformed_value_it_is(
    webhook: Webhook, path: tuple[str | int, ...], found: str, deep: str,
) -> None:
    body = _review(path, deep)
    start = value_text.shown(orjson.loads(deep))
    for endpoint in ("/mutate", "/validate"):
        async with await webhook.post(endpoint, body) as resp:
            assert resp.status == 200
            response = (await resp.json())["response"]
        said = json.dumps(response)
        assert "internal error" not in said, said
        if endpoint == "/validate" and found:
            message = response["status"]["message"] if not response["allowed"] else " ".join(response.get("warnings", []))
            assert found.format(start) in message, message
            assert len(message) < 2000


@pytest.mark.parametrize("field", ["apiVersion", "kind"])
async def test_a_deep_value_in_the_review_itself_is_a_400_naming_the_field(webhook: Webhook, field: str) -> None:
    sent = load_review(corpus_reviews()[0])
    body = json.dumps({**sent, field: "@deep@"}).replace('"@deep@"', DEEP_LIST)
    async with await webhook.post("/validate", body) as resp:
        assert resp.status == 400
        message = (await resp.json())["message"]
    assert message.startswith(f"{field} must be ") and message.endswith(", got " + value_text.shown(orjson.loads(DEEP_LIST)))


#: past what orjson reads: kube-apiserver itself reads JSON up to 10,000 levels, so a custom resource whose
#: schema preserves unknown fields can carry this in a review
TOO_DEEP = "[" * 1100 + "]" * 1100


@pytest.mark.parametrize("endpoint", ["/mutate", "/validate"])
async def test_a_review_nested_past_what_the_reader_reads_is_refused_in_an_answer(webhook: Webhook, endpoint: str) -> None:
    """Answered with the request's uid and a message the user reads (a 400 would make kube-apiserver
    say only that calling the webhook failed); the control, nested as deep as orjson reads, is judged."""
    too_deep, control = _review(("spec", "x-extra"), TOO_DEEP), _review(("spec", "x-extra"), DEEP_LIST)
    uid = load_review(next(p for p in corpus_reviews() if "validate_create_pods" in p.name))["request"]["uid"]
    async with await webhook.post(endpoint, too_deep) as resp:
        assert resp.status == 200
        answer = await resp.json()
    async with webhook.session.get(webhook.base + "/metrics") as resp:
        scraped = await resp.text()
    # counted as the denial it is, in the requests and in the latency (what an SLO on admissions reads)
    assert f'gpu_admission_requests_total{{decision="deny",endpoint="{endpoint}",kind="",operation=""}} 1.0' in scraped
    assert f'gpu_admission_request_duration_seconds_count{{endpoint="{endpoint}"}} 1.0' in scraped
    assert answer["apiVersion"] == "admission.k8s.io/v1" and answer["kind"] == "AdmissionReview"
    response = answer["response"]
    assert response["uid"] == uid and response["allowed"] is False
    assert response["status"]["code"] == 400
    assert "nests lists or maps deeper than 1,024 levels" in response["status"]["message"]
    async with await webhook.post(endpoint, control) as resp:
        assert resp.status == 200
        response = (await resp.json())["response"]
    assert response["uid"] == uid and response["allowed"] is True


async def test_a_body_too_deep_that_is_no_review_stays_a_400(webhook: Webhook) -> None:
    sent = load_review(corpus_reviews()[0])
    for broken in ({**sent, "kind": "Review"}, {**sent, "request": {k: v for k, v in sent["request"].items() if k != "uid"}}):
        broken = copy.deepcopy(broken)
        broken["request"]["object"]["spec"]["x"] = "@deep@"
        body = json.dumps(broken).replace('"@deep@"', TOO_DEEP)
        async with await webhook.post("/validate", body) as resp:
            assert resp.status == 400
            assert "depth limit exceeded" in (await resp.json())["message"]


keys = st.sampled_from(["uid", "request", "kind", "apiVersion"]) | st.text(alphabet='ab"\\{}[]:, \u00e9', max_size=4)
small_values = st.recursive(
    st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(alphabet='uid"\\{}[]:,', max_size=6),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(keys, inner, max_size=3),
    max_leaves=5,
)
reviews = st.fixed_dictionaries({
    "apiVersion": st.sampled_from(review.API_VERSIONS), "kind": st.just("AdmissionReview"),
    "request": st.fixed_dictionaries({"uid": st.text(alphabet='u-"\\{}', min_size=1, max_size=8)},
                                     optional={"object": small_values, "kind": small_values}),
}, optional={"response": small_values, "a\"uid": small_values})


@given(reviews, st.dictionaries(keys, small_values, max_size=3), st.randoms(use_true_random=False))
def test_the_envelope_of_a_review_is_what_its_parse_reads(sent: dict[str, Any], extra: dict[str, Any], rng: Any) -> None:
    """Fields in any order, with strings and keys that look like JSON's own characters: the envelope
    read by tokens is the parse's apiVersion and request.uid; past the depth it is still read."""
    sent = {**extra, **sent}
    request = list(sent["request"].items())
    rng.shuffle(request)
    sent["request"] = dict(request)
    order = list(sent.items())
    rng.shuffle(order)
    body = orjson.dumps(dict(order))
    assert review._envelope(body) == (sent["apiVersion"], sent["request"]["uid"])
    deep = orjson.dumps({**dict(order), "z": "@deep@"}).replace(b'"@deep@"', TOO_DEEP.encode())
    assert review._envelope(deep) == (sent["apiVersion"], sent["request"]["uid"])


near_reviews = st.fixed_dictionaries({}, optional={
    "apiVersion": st.sampled_from([*review.API_VERSIONS, "v1", ""]) | small_values,
    "kind": st.sampled_from(["AdmissionReview", "Review"]) | small_values,
    "request": st.fixed_dictionaries({}, optional={"uid": st.sampled_from(["", "u"]) | small_values,
                                                   "object": small_values}) | small_values,
}) | small_values


@given(near_reviews)
def test_an_envelope_only_where_the_parse_finds_a_review(value: Any) -> None:
    body = orjson.dumps(value)
    is_review = (isinstance(value, dict) and value.get("kind") == "AdmissionReview"
                 and value.get("apiVersion") in review.API_VERSIONS and isinstance(value.get("request"), dict)
                 and isinstance(value["request"].get("uid"), str) and value["request"]["uid"])
    expected = (value["apiVersion"], value["request"]["uid"]) if is_review else None
    assert review._envelope(body) == expected


def test_the_envelope_is_looked_for_where_kube_apiserver_writes_it() -> None:
    """Within the body's first 8 KiB (kube-apiserver writes it ~150 bytes in): a forged body of
    megabytes of "[" before its uid costs no more than that."""
    sent = {"kind": "AdmissionReview", "apiVersion": "admission.k8s.io/v1", "request": {"uid": "u", "object": "@deep@"}}
    early = orjson.dumps(sent).replace(b'"@deep@"', TOO_DEEP.encode())
    assert review._envelope(early) == ("admission.k8s.io/v1", "u")
    late = orjson.dumps({**sent, "request": {"object": "@deep@", "uid": "u"}})
    assert review._envelope(late.replace(b'"@deep@"', b"[" * 5000 + b"]" * 5000)) is None
    assert review._envelope(late.replace(b'"@deep@"', b"[" * 1000 + b"]" * 1000)) == ("admission.k8s.io/v1", "u")


def test_no_envelope_from_what_is_no_object_or_lies_past_the_parse() -> None:
    """A body whose top is a list, a string not closed where the scan stops (its quotes are not
    read one by one to the end), and fields only past where the parse stopped: no envelope."""
    fields = b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"uid":"u"}}'
    assert review._envelope(fields) == ("admission.k8s.io/v1", "u")  # the control
    assert review._envelope(b"[" + fields + b"]") is None
    assert review._envelope(b'{"x":"' + b'\\"' * 4000) is None
    assert review._envelope(b"[" * 1025 + b'"' + b'\\"' * 3500) is None
    deep = b'{"kind":"AdmissionReview","apiVersion":"admission.k8s.io/v1","request":{"object":' + TOO_DEEP.encode()
    late = deep + b',"uid":"u"}}'
    with pytest.raises(review.ReviewError) as raised:
        review.parse_review(late)
    assert not isinstance(raised.value, UnreadableReview) and "depth limit exceeded" in str(raised.value)
    assert review._envelope(late) == ("admission.k8s.io/v1", "u")  # (read whole, as no parse stopped it)
