"""AdmissionReview encoding: the patch and the response body."""

from __future__ import annotations

import base64
import json
import re
from dataclasses import FrozenInstanceError, replace
from typing import Any

import pytest

from webhook import review
from webhook.errors import ReviewError
from webhook.policy.decision import Decision, Finding
from webhook.policy.request import Request
from webhook.policy.schema import Mode


def test_a_patch_is_the_base64_of_its_json() -> None:
    ops = [{"op": "add", "path": "/spec/runtimeClassName", "value": "nvidia"}, {"op": "remove", "path": "/x/0"}]
    encoded = review.encode_patch(tuple(ops))
    assert json.loads(base64.b64decode(encoded, validate=True)) == ops
    assert "\n" not in encoded


def test_keys_that_are_not_strings_are_encoded_as_their_text() -> None:
    # a policy's YAML can hold an integer key (e.g. in a label map); kube-apiserver needs strings
    ops = [{"op": "add", "path": "/metadata/labels", "value": {1: "a", "b": {2: True}}}]
    assert json.loads(base64.b64decode(review.encode_patch(ops))) == [
        {"op": "add", "path": "/metadata/labels", "value": {"1": "a", "b": {"2": True}}}
    ]
    assert json.loads(review.encode({"response": {3: None}})) == {"response": {"3": None}}


def test_what_json_cannot_hold_is_still_refused() -> None:
    with pytest.raises(TypeError):
        review.encode({"a": object()})


def test_a_long_warning_keeps_its_subject_and_what_to_do() -> None:
    # kube-apiserver keeps 256 characters of a warning; the middle is what can go
    subject = '[gpu-validations/cudaDriver] Deployment ml/triton spec.template container "triton": '
    remedy = "use an image built for it or target newer nodes (already so before this update)"
    long = subject + "CUDA 12.6.0 (NGC 24.08) needs driver >= 560.28.03; " * 4 + remedy
    [kept] = review.limit_warnings([long, long])
    assert len(kept) == review.MAX_WARNING_CHARS
    assert kept.startswith(subject) and kept.endswith(remedy) and "…" in kept
    short = subject + remedy
    assert review.limit_warnings([short]) == [short]


#: kube-apiserver's IsQualifiedName, which the key "<webhook name>/<key>" must pass to be kept
QUALIFIED_NAME = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")


def _review() -> review.Review:
    return review.parse_review(json.dumps({
        "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
        "request": {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
                    "namespace": "ml", "name": "train", "object": {"kind": "Pod"}},
    }))


def test_a_parsed_request_is_the_request_its_fields_make() -> None:
    """The server builds Requests without their dataclass __init__ (review._request): the same object."""
    parsed = _review()
    expected = Request(operation="CREATE", group="", version="v1", kind="Pod", namespace="ml", name="train",
                       object={"kind": "Pod"})
    assert parsed.request == expected
    assert repr(parsed.request) == repr(expected) and vars(parsed.request) == vars(expected)
    assert replace(parsed.request, name="other").name == "other"
    with pytest.raises(FrozenInstanceError):
        parsed.request.name = "x"  # type: ignore[misc]
    assert (parsed.api_version, parsed.uid) == ("admission.k8s.io/v1", "u-1")
    with pytest.raises(AttributeError):
        parsed.uid = "x"  # type: ignore[misc]


@pytest.mark.parametrize("field", ["namespace", "name", "subResource"])
@pytest.mark.parametrize("value", [5, ["ml"], {"name": "ml"}, True])
def test_a_request_field_that_is_not_a_string_is_named(field: str, value: Any) -> None:
    """namespace, name and subResource: a string or absent; anything else refused (a 400), the field named."""
    request = {"uid": "u-1", "kind": {"group": "", "version": "v1", "kind": "Pod"}, "operation": "CREATE",
               "namespace": "ml", "name": "train", "object": {"kind": "Pod"}, field: value}
    with pytest.raises(ReviewError, match=rf"^request\.{field} must be a string$"):
        review.parse_review(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}))
    # the control: a string, or the field absent or null, is read
    for kept in ("pods-status", None):
        parsed = review.parse_review(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
                                                 "request": {**request, field: kept}}))
        assert parsed.request.operation == "CREATE"
    request.pop(field)
    assert review.parse_review(json.dumps({"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}))


def _finding(mode: Mode, message: str, rule: str = "quota") -> Finding:
    return Finding("caps", rule, mode, message)


def test_audit_findings_go_to_the_audit_log_under_a_key_kube_apiserver_keeps() -> None:
    decision = Decision(findings=(
        _finding("audit", "pod ml/train requests 2 GPUs over the cap of 1"),
        _finding("warn", "a warned finding", rule="resourceShape"),
        _finding("audit", "pod ml/train would set runtimeClassName", rule="runtimeClass"),
    ), warnings=("[caps/resourceShape] a warned finding",))
    response = review.build_response(_review(), decision, mutating=False)["response"]
    (key, value), = response["auditAnnotations"].items()
    for webhook_name in ("validate.gpu-admission.io", "mutate.gpu-admission.io"):
        prefix, name = f"{webhook_name}/{key}".split("/")
        assert DNS_SUBDOMAIN.fullmatch(prefix) and QUALIFIED_NAME.fullmatch(name) and len(name) <= 63
    assert json.loads(value) == [
        "[caps/quota] pod ml/train requests 2 GPUs over the cap of 1",
        "[caps/runtimeClass] pod ml/train would set runtimeClassName",
    ]
    assert response["allowed"] and response["warnings"] == ["[caps/resourceShape] a warned finding"]


def test_the_audit_annotation_is_bounded_like_the_warnings() -> None:
    many = tuple(_finding("audit", f"finding {i}: " + "x" * 1000, rule=f"r{i}") for i in range(50))
    value = review.build_response(_review(), Decision(findings=many), mutating=True)["response"]["auditAnnotations"]
    kept = json.loads(value[review.AUDIT_ANNOTATION])
    assert 0 < len(kept) < 50 and all(len(k) <= review.MAX_WARNING_CHARS for k in kept)
    assert sum(map(len, kept)) <= review.MAX_WARNINGS_TOTAL
    assert kept[0].startswith("[caps/r0] finding 0:")


@pytest.mark.parametrize("findings", [(), (_finding("warn", "warned"),), (_finding("enforce", "denied"),)])
def test_no_audit_annotation_without_audit_findings(findings: tuple[Finding, ...]) -> None:
    decision = Decision(allowed=not any(f.mode == "enforce" for f in findings), findings=findings)
    assert "auditAnnotations" not in review.build_response(_review(), decision, mutating=False)["response"]


def test_the_requests_user_is_read_from_user_info() -> None:
    """userInfo.username, which the API server authenticates, tells the resourceclaim controller's claims
    (docs/quota.md, "DRA claims"); absent or not a string, it is ""."""
    def user(info: Any) -> str:
        return review.parse_review(json.dumps({
            "apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview",
            "request": {"uid": "u-1", "kind": {"group": "resource.k8s.io", "version": "v1", "kind": "ResourceClaim"},
                        "operation": "CREATE", "namespace": "ml", "object": {"kind": "ResourceClaim"},
                        **({} if info is None else {"userInfo": info})},
        })).request.user

    assert user({"username": "system:kube-controller-manager", "groups": ["system:authenticated"]}) == \
        "system:kube-controller-manager"
    assert user(None) == "" and user({"username": 7}) == "" and user("x") == ""
