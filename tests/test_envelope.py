"""The review's body read once before its parse (webhook/_envelope.c, the compiled build's): its objects
counted, and request.object's and request.oldObject's metadata.managedFields cut out, to the same JSON
value less those members whatever the text holds; the answers byte for byte those of the whole body."""

from __future__ import annotations

import copy
import functools
import json
import random
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.support import REPO, corpus_reviews
from webhook import compiled, review
from webhook.errors import RequestBodyError
from webhook.policy.loader import load_directory
from webhook.server import evaluation, handlers
from webhook.server.limits import Limits
from webhook.view.snapshot import EMPTY_VIEW

# the C reader is built with the compiled core: `make test` runs this file on both builds, and the
# compiled run fails (tests/test_compiled.py) unless the reader is there
native = pytest.mark.skipif(review._TRIM is None, reason="interpreted build: webhook._envelope is built with the compiled core")


def _expected(value: Any) -> Any:
    """``value`` less the members the reader cuts."""
    value = copy.deepcopy(value)
    req = value.get("request") if isinstance(value, dict) else None
    if isinstance(req, dict):
        for key in ("object", "oldObject"):
            obj = req.get(key)
            if isinstance(obj, dict) and isinstance(obj.get("metadata"), dict):
                obj["metadata"].pop("managedFields", None)
    return value


def _trim(body: bytes, limit: int = 10**9) -> tuple[int, bytes]:
    assert review._TRIM is not None
    return review._TRIM(body, limit)


@functools.cache
def _bodies() -> tuple[bytes, ...]:
    """Every corpus review as kube-apiserver wrote it (indented) and compact, as it sends it (read once
    per run, kept as a tuple of bytes: no test can change it for the next)."""
    found: list[bytes] = []
    for path in corpus_reviews():
        text = path.read_bytes()
        found += [text, orjson.dumps(orjson.loads(text))]
    return tuple(found)


@native
def test_the_corpus_reviews_lose_their_managed_fields_and_nothing_else() -> None:
    cut = 0
    for body in _bodies():
        objects, trimmed = _trim(body)
        value = orjson.loads(body)
        assert orjson.loads(trimmed) == _expected(value)
        # every object counted, at most every "{" (past the last member cut, strings' ones too: a bound)
        assert json.dumps(value).count("{") - sum(s.count("{") for s in _strings(value)) <= objects <= body.count(b"{")
        cut += trimmed != body
    assert cut >= len(_bodies()) // 2  # (kube-apiserver sends managedFields with nearly every object)


def _strings(value: Any) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [*value.keys(), *(s for v in value.values() for s in _strings(v))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return []


@native
@pytest.mark.parametrize("metadata, left", [
    ('{"managedFields":[1],"a":1}', '{"a":1}'),
    ('{"a":1,"managedFields":[1]}', '{"a":1}'),
    ('{"managedFields":[1]}', "{}"),
    ('{"managedFields":1,"managedFields":2}', "{}"),  # duplicate keys: orjson keeps the last; both go
    ('{"managedFields":1,"managedFields":2,"x":3}', '{"x":3}'),
    ('{"x":0,"managedFields":1,"managedFields":2,"x":3}', '{"x":0,"x":3}'),
    (' { "managedFields" : [ {"\\"}]":"}"} ] , "b" : "c" } ', '{"b":"c"}'),
    ('{"a":"\\\\","managedFields":[{}]}', '{"a":"\\\\"}'),
    # a string that reads as the member, were quotes not followed with their escapes
    ('{"a":"x\\",\\"managedFields\\":[]","managedFields":[{"m":"]}"}]}', '{"a":"x\\",\\"managedFields\\":[]"}'),
    ('{"managed\\u0046ields":[1]}', '{"managedFields":[1]}'),  # spelt with an escape: left in (only its parse lost)
])
def test_only_the_member_at_its_path_is_cut_and_what_stays_is_one_json_value(metadata: str, left: str) -> None:
    for key in ("object", "oldObject"):
        body = f'{{"request":{{"uid":"u","{key}":{{"metadata":{metadata},"spec":{{"metadata":{{"managedFields":[]}}}}}}}}}}'.encode()
        objects, trimmed = _trim(body)
        assert objects >= 4
        assert orjson.loads(trimmed) == {"request": {"uid": "u", key: {"metadata": orjson.loads(left), "spec": {"metadata": {"managedFields": []}}}}}


@native
@pytest.mark.parametrize("body", [
    b'{"x":{"request":{"object":{"metadata":{"managedFields":[1]}}}}}',  # not the review's request
    b'[{"request":{"object":{"metadata":{"managedFields":[1]}}}}]',
    b'{"request":{"options":{"metadata":{"managedFields":[1]}}}}',
    b'{"request":{"object":{"spec":{"template":{"metadata":{"managedFields":[1]}}}}}}',
])
def test_a_member_elsewhere_stays(body: bytes) -> None:
    assert _trim(body)[1] == body


@native
@pytest.mark.parametrize("body", [
    b"", b"   ", b"{", b"}", b"[1,]", b'{"a":1 "b":2}', b'{"a"}', b"1 2", b'"abc', b'{"a":1,}', b'{"a" 1}',
    b'{"request":{"object":{"metadata":{"managedFields":[1}}}}}',
    b'{"request":{"object":{"metadata":{"managedFields":[1]}}}',
    b'{"request":{"object":{"metadata":{"managedFields":[1]}}}}x',
    b'{"request":{"object":{"metadata":{"managedFields":[1]},}}}',
    b'{"request":{"object":{"metadata":{"managedFields" [1]}}}}',
    b'{"request":{"object":{"metadata":{"managedFields":["\\"]}}}}',
    b"[" * 1025 + b"]" * 1025,  # past orjson's depth: its own words say so (parse_review's UnreadableReview)
])
def test_what_is_not_one_json_value_is_left_as_it_is_for_the_parse_to_refuse(body: bytes) -> None:
    assert _trim(body) == (-1, body)


@native
def test_counting_stops_past_the_limit_and_the_refusal_counts_them_all() -> None:
    dense = b"[" + b"{}," * 5000 + b"{}]"
    assert _trim(dense, 10**9)[0] == 5001
    assert _trim(dense, 100) == (101, dense)
    with pytest.raises(RequestBodyError) as refused:
        handlers._read_objects(dense, 100)
    assert refused.value.status == 413 and "up to 5001 JSON objects" in str(refused.value)
    assert handlers._read_objects(dense, 5001) == (5001, dense)


_SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), st.floats(allow_nan=False, allow_infinity=False),
                     st.text(alphabet=st.sampled_from('ab"\\/{}[]:,\n\t é\u2028'), max_size=8))
_KEYS = st.sampled_from(["managedFields", "metadata", "object", "oldObject", "request", "spec", "a", 'x"y', "\\"])
_VALUES = st.recursive(_SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                        st.dictionaries(_KEYS, inner, max_size=4)), max_leaves=20)


def _written(value: Any, rng: random.Random) -> str:
    """``value`` as JSON with blanks here and there, and members repeated (a key twice: orjson keeps the last)."""
    def blank() -> str:
        return rng.choice(["", "", " ", "\n  ", "\t"])
    if isinstance(value, dict):
        members = [f"{blank()}{json.dumps(k)}{blank()}:{blank()}{_written(v, rng)}{blank()}" for k, v in value.items()]
        return "{" + ",".join(members) + blank() + "}"
    if isinstance(value, list):
        return "[" + ",".join(blank() + _written(v, rng) + blank() for v in value) + blank() + "]"
    return json.dumps(value)


@native
@settings(max_examples=400, deadline=None)
@given(_VALUES, st.dictionaries(_KEYS, _VALUES, max_size=3), st.booleans(), st.integers(0, 2**32))
def test_any_review_shaped_value_loses_exactly_its_managed_fields(value: Any, metadata: dict[str, Any], old: bool, seed: int) -> None:
    rng = random.Random(seed)
    review_value = {"apiVersion": "admission.k8s.io/v1", "request": {
        "oldObject" if old else "object": {"metadata": {**metadata, "managedFields": value}, "spec": value}, "x": value}}
    body = _written(review_value, rng).encode()
    objects, trimmed = _trim(body)
    if objects < 0:  # what is cut must be plainly valid JSON (string_end with plain, cut_scalar): else parsed as sent
        assert not _plain(value) and trimmed == body
        return
    assert orjson.loads(trimmed) == _expected(orjson.loads(body))
    assert body.count(b"{") - sum(s.count("{") for s in _strings(review_value)) <= objects <= body.count(b"{")


def _plain(value: Any) -> bool:
    """Whether ``value`` is written as JSON in printable ASCII, with escapes of one character and
    numbers without exponents of at most 17 characters."""
    if isinstance(value, dict):
        return all(_plain(k) and _plain(v) for k, v in value.items())
    if isinstance(value, list):
        return all(_plain(v) for v in value)
    text = json.dumps(value)
    if isinstance(value, str):
        return "\\u" not in text.replace("\\\\", "")
    return value is None or isinstance(value, bool) or (len(text) <= 17 and "e" not in text)


@native
@settings(max_examples=400, deadline=None)
@given(st.integers(0, 2**32), st.binary(min_size=1, max_size=4))
def test_bytes_put_into_a_member_cut_are_refused_as_orjson_refuses_them(seed: int, put: bytes) -> None:
    """Nobody reads a member cut: whatever orjson would refuse in it, the reader leaves to orjson."""
    rng = random.Random(seed)
    body = rng.choice([b for b in _bodies() if b"managedFields" in b])
    start = body.index(b'"managedFields"')
    at = rng.randrange(start + 16, start + 200)
    broken = body[:at] + put + body[at:]
    objects, trimmed = _trim(broken)
    try:
        orjson.loads(broken)
    except orjson.JSONDecodeError:
        assert objects < 0 and trimmed == broken, (put, broken[start:at + 20])
        return
    assert orjson.loads(trimmed) == _expected(orjson.loads(broken)) or objects < 0


@native
@pytest.mark.parametrize("cut, taken", [
    ("[true,false,null,0,-1.5,12,-0,0.25]", True),
    ("[tru]", False), ("[truex]", False), ("[01]", False), ("[1.]", False), ("[-]", False), ("[.5]", False),
    ("[NaN]", False), ("[Infinity]", False), ("[1e5]", False), ("[123456789012345678]", False),
    ('["\\u0041"]', False), ('["\\x"]', False), ('["a\tb"]', False), ('["\u00e9"]', False),
])
def test_a_member_is_cut_only_when_plainly_valid(cut: str, taken: bool) -> None:
    body = ('{"request":{"operation":"CREATE","object":{"metadata":{"name":"a","managedFields":' + cut + '}}}}').encode()
    objects, trimmed = _trim(body)
    assert (objects >= 0) == taken and (trimmed == body) != taken
    if taken:
        assert orjson.loads(trimmed) == {"request": {"operation": "CREATE", "object": {"metadata": {"name": "a"}}}}


@native
@settings(max_examples=300, deadline=None)
@given(st.integers(0, 2**32))
def test_a_broken_review_is_not_made_whole_by_the_cut(seed: int) -> None:
    """A corpus review with a structural character added, dropped or doubled: whatever orjson refuses
    in the whole body, it refuses in what the reader gives it (or the reader leaves the body as it is)."""
    rng = random.Random(seed)
    body = rng.choice(_bodies())
    at = rng.randrange(len(body))
    mark = rng.choice(b'{}[],:"')
    how = rng.choice(["add", "drop", "double"])
    if how == "add":
        broken = body[:at] + bytes([mark]) + body[at:]
    else:
        positions = [i for i, c in enumerate(body) if c == mark]
        if not positions:
            return
        at = rng.choice(positions)
        broken = body[:at] + body[at:at + 1] + body[at:] if how == "double" else body[:at] + body[at + 1:]
    objects, trimmed = _trim(broken)
    try:
        whole: Any = orjson.loads(broken)
    except orjson.JSONDecodeError:
        if objects >= 0:
            with pytest.raises(orjson.JSONDecodeError):
                orjson.loads(trimmed)
        return
    assert objects >= 0 and orjson.loads(trimmed) == _expected(whole)


@native
def test_the_answers_are_byte_for_byte_those_of_the_whole_review() -> None:
    """What the server answers from the trimmed body, and the line it logs, are what it answers from the
    whole one: every corpus review, mutating and validating."""
    policies, limits = load_directory(REPO / "policies"), Limits()
    for body in _bodies():
        for phase in ("mutate", "validate"):
            answers = []
            for text in (body, handlers._read_objects(body, limits.max_objects)[1]):
                parsed = review.parse_review(text)
                outcome = evaluation.decide(policies, parsed, EMPTY_VIEW, phase, limits, text.count(b"{"))  # type: ignore[arg-type]
                answers.append(review.encode(handlers._answer(parsed, outcome.decision, phase, limits.max_patch_bytes)[1]))  # type: ignore[arg-type]
            assert answers[0] == answers[1]


def test_the_compiled_build_has_the_reader_and_the_interpreted_one_does_without() -> None:
    assert (review._TRIM is not None) == ("webhook._envelope" in compiled.compiled_modules())
    body = next(b for b in _bodies() if b"managedFields" in b)
    objects, trimmed = handlers._read_objects(body, 10**6)
    assert objects > 0 and (b"managedFields" in trimmed) == (review._TRIM is None)
