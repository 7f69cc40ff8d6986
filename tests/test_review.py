"""AdmissionReview encoding: the patch and the response body."""

from __future__ import annotations

import base64
import json

import pytest

from webhook import review


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
