"""Query parameters of list and watch requests: numbers and continue tokens.

A continue token is built like kube-apiserver's: unpadded URL-safe base64
of ``{"v", "rv", "start"}``, where ``start`` is the key just after the last
item sent, so the next page resumes at the same snapshot.
"""

from __future__ import annotations

import base64
import json

from tests.fakeapi.status import ApiError


def number(text: str | None) -> int:
    """A numeric query parameter (resourceVersion, limit); 0 when absent."""
    try:
        return int(text or 0)
    except ValueError as exc:
        raise ApiError(400, f"Invalid value: {text!r}: must be an integer") from exc


def encode_continue(rv: int, last_key: str) -> str:
    """The token for the page after ``last_key`` of the list at ``rv``."""
    raw = json.dumps({"v": "meta.k8s.io/v1", "rv": rv, "start": last_key + "\x00"}, separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_continue(token: str) -> tuple[int, str]:
    """The resourceVersion and start key of a continue token; 400 when malformed."""
    try:
        raw = json.loads(base64.urlsafe_b64decode(token + "=" * (-len(token) % 4)))
        return int(raw["rv"]), str(raw["start"])
    except (ValueError, KeyError, TypeError) as exc:
        raise ApiError(400, f"continue key is not valid: {exc}", "BadRequest") from exc
