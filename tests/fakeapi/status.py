"""Status objects: how the fake answers a failed request, as kube-apiserver does.

Any code below the HTTP layer raises :class:`ApiError`; the middleware turns
it into a JSON ``Status`` response with the error's code.
"""

from __future__ import annotations

from tests.fakeapi.resources import Obj, ResourceType

_REASONS = {
    400: "BadRequest", 401: "Unauthorized", 403: "Forbidden", 404: "NotFound",
    405: "MethodNotAllowed", 409: "Conflict", 410: "Expired", 415: "UnsupportedMediaType",
    422: "Invalid", 429: "TooManyRequests", 500: "InternalError",
    503: "ServiceUnavailable", 504: "Timeout",
}  # fmt: skip


class ApiError(Exception):
    """A request the fake answers with a Status object."""

    def __init__(self, code: int, message: str, reason: str = "", details: Obj | None = None):
        super().__init__(message)
        self.status = status_object(code, message, reason, details)


def status_object(code: int, message: str, reason: str = "", details: Obj | None = None) -> Obj:
    """A ``Status`` of failure, shaped like kube-apiserver's."""
    body: Obj = {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure"}
    body["message"] = message
    body["reason"] = reason or _REASONS.get(code, "Unknown")
    if details:
        body["details"] = details
    body["code"] = code
    return body


def not_found(rt: ResourceType, name: str) -> ApiError:
    """The 404 kube-apiserver gives for a missing object of ``rt``."""
    details = {"name": name, "kind": rt.plural} | ({"group": rt.group} if rt.group else {})
    return ApiError(404, f'{rt.qualified} "{name}" not found', "NotFound", details)
