"""AdmissionReview in and out (admission.k8s.io/v1, and v1beta1 answered in kind).

``parse_review`` turns a request body into a :class:`Request` or raises
ReviewError (the server answers 400); ``build_response`` turns a Decision
into the response kube-apiserver expects (FACTS.md §6).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any, Final, NamedTuple, TypedDict

import orjson
import pybase64

from webhook.errors import ReviewError, UnreadableReview
from webhook.kube import value_text
from webhook.policy.decision import Decision
from webhook.policy.request import Request

# (compiled, a Final name is a C static: the module's attribute is read once, not on every
# admission through the module, ~250 instructions a read)
_LOADS: Final = orjson.loads
_DUMPS: Final = orjson.dumps
_B64: Final = pybase64.b64encode_as_string


def _native_trim() -> Callable[[bytes, int], tuple[int, bytes]] | None:
    try:
        from webhook._envelope import trim  # (built with the compiled core: webhook/compiled.py NATIVE)
    except ImportError:
        return None
    return trim


_TRIM: Final = _native_trim()

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
OPERATIONS = ("CREATE", "UPDATE", "DELETE", "CONNECT")
MAX_WARNING_CHARS = 256
MAX_WARNINGS_TOTAL = 4096
#: a denial lists every violation; past this many characters the rest is counted, not listed
MAX_MESSAGE_CHARS = 8192
#: the audit annotation naming what audit-mode rules found. kube-apiserver stores it in the
#: request's audit event as "<webhook name>/audit-findings" and drops (with a warning in its own
#: log) any key that is not then a qualified name: one "/", a name part of at most 63 characters
AUDIT_ANNOTATION = "audit-findings"
#: the audit annotation naming the GPUPolicyExceptions that lifted rules for the object
#: ("<webhook name>/exceptions" in the audit event), comma-separated: who was exempted, and when
EXCEPTIONS_ANNOTATION = "exceptions"


class StatusJSON(TypedDict, total=False):
    code: int
    message: str
    reason: str
    status: str


class ResponseJSON(TypedDict, total=False):
    uid: str
    allowed: bool
    patchType: str
    patch: str
    warnings: list[str]
    auditAnnotations: dict[str, str]
    status: StatusJSON


class ReviewJSON(TypedDict):
    apiVersion: str
    kind: str
    response: ResponseJSON


class Review(NamedTuple):
    """A parsed AdmissionReview: what to echo back, and the engine's request (immutable: a named
    tuple, built in one step where a frozen dataclass pays a call per field, on every admission)."""

    api_version: str
    uid: str
    request: Request


_new_review = tuple.__new__
_new_object = object.__new__
_set_attribute = object.__setattr__


def parse_review(body: bytes | str) -> Review:
    """Decode and check an AdmissionReview body; ReviewError says what is wrong."""
    try:
        # orjson: several times faster than json on the large objects reviews carry;
        # it refuses invalid UTF-8, NaN and nesting past 1024 levels, as it should
        data = _LOADS(body)
    except orjson.JSONDecodeError as exc:
        if str(exc).startswith(_TOO_DEEP):
            envelope = _envelope(body, exc.pos)
            if envelope is not None:
                raise UnreadableReview(
                    f"gpu-admission cannot read this object: it nests lists or maps deeper than {MAX_DEPTH:,} "
                    f"levels (character {exc.pos:,} of the review); nothing in a workload needs that many",
                    *envelope) from exc
        raise ReviewError(f"request body is not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ReviewError("request body is not a JSON object")
    api_version = data.get("apiVersion")
    if api_version not in API_VERSIONS:
        raise ReviewError(f"apiVersion must be one of {', '.join(API_VERSIONS)}, got {value_text.shown(api_version)}")
    if data.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind must be AdmissionReview, got {value_text.shown(data.get('kind'))}")
    req = data.get("request")
    if not isinstance(req, dict):
        raise ReviewError("AdmissionReview has no request object")
    return _new_review(Review, (api_version, _uid(req), _request(req)))


def trimmed(body: bytes, limit: int) -> tuple[int, bytes]:
    """``body``'s JSON objects counted, and ``body`` without the ``metadata.managedFields`` of
    ``request.object`` and ``request.oldObject``: the field managers' record kube-apiserver sends with
    every object (a fifth to a quarter of a pod's review), which no rule reads and whose parse and
    freeing cost more than a pod's rules. One pass in C (webhook/_envelope.c): the JSON grammar
    followed on the path to each cut and inside it, so that a cut is a whole member at that path
    whatever a string holds; every other value followed by its strings and brackets only (its
    commas, colons and literals left for orjson to judge), and, past the last metadata a member can
    be cut from, only the ``{`` counted. It stops past ``limit`` objects. (-1, ``body``) where it
    does not read ``body`` (brackets or strings that do not close, a member on the path out of the
    grammar, nested past orjson's depth, or the interpreted build, which has no C): the body is then
    parsed as it is."""
    if _TRIM is None:
        return -1, body
    return _TRIM(body, limit)


#: orjson reads JSON nested at most this deep, and says so with this
MAX_DEPTH = 1024
_TOO_DEEP = "depth limit exceeded"
#: a JSON string (escapes kept), or one of the characters that give JSON its structure
#: (a quote with no closing one matches alone: a string run past where the scan stops ends it, so that
#: no quote is matched again and again to the end: linear)
_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*+"|"|[][{}:,]')


#: the envelope of a review too deep to parse is looked for this far into its body: kube-apiserver
#: writes kind, apiVersion and then the request with its uid first, ~150 bytes in (a body of 3 MiB
#: of "[" read whole would hold the loop for a second)
_ENVELOPE_BYTES = 8192


def _envelope(body: bytes | str, end: int = _ENVELOPE_BYTES) -> tuple[str, str] | None:
    """(apiVersion, request.uid) of an AdmissionReview too deep to parse, read by its tokens before
    ``end`` and within the body's first ``_ENVELOPE_BYTES`` (no recursion; ``end``: where the parse
    stopped, the body well-formed JSON before it); None when they are not those of a review: the
    body is no object, a string is not closed before the end, or the fields are not found."""
    data = (body.encode() if isinstance(body, str) else body)[:min(end, _ENVELOPE_BYTES)]
    found: dict[bytes, bytes] = {}
    objects: list[bool] = []  # per open container, outermost first: is it an object (else a list)
    key, expect_key, in_request = b"", False, False
    for match in _TOKEN.finditer(data):
        token = match.group()
        if token == b'"' or (not objects and token != b"{"):
            return None
        if token == b"{" or token == b"[":
            in_request = in_request or (len(objects) == 1 and key == b'"request"' and token == b"{")
            objects.append(token == b"{")
            expect_key = token == b"{"
        elif token == b"}" or token == b"]":
            if not objects:
                return None
            objects.pop()
            in_request = in_request and len(objects) > 1
            if not objects:
                return None
            expect_key = False
        elif token == b",":
            expect_key = bool(objects) and objects[-1]
        elif token == b":":
            continue
        elif expect_key:
            key, expect_key = token, False
        elif len(objects) == 1 or (in_request and len(objects) == 2):
            found.setdefault((b"request." if len(objects) == 2 else b"") + key, token)
            version_token, kind_token, uid_token = found.get(b'"apiVersion"'), found.get(b'"kind"'), found.get(b'request."uid"')
            if version_token is not None and kind_token is not None and uid_token is not None:
                try:  # (each token a whole JSON string: its escapes read as the parse reads them)
                    api_version, kind, uid = _LOADS(version_token), _LOADS(kind_token), _LOADS(uid_token)
                except orjson.JSONDecodeError:
                    return None
                if api_version in API_VERSIONS and kind == "AdmissionReview" and type(uid) is str and uid:
                    return api_version, uid  # type: ignore[no-any-return]
                return None
    return None


def refusal(api_version: str, uid: str, message: str) -> ReviewJSON:
    """The answer that refuses a review gpu-admission cannot judge (HTTP 200: the answer is the refusal)."""
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": {
        "uid": uid, "allowed": False, "status": _failure(400, "BadRequest", message),
    }}


def _failure(code: int, reason: str, message: str) -> StatusJSON:
    """The status of an answer that refuses (its message cut to what kube-apiserver shows)."""
    return {"code": code, "reason": reason, "status": "Failure", "message": limit_message(message)}


def _uid(req: dict[str, Any]) -> str:
    uid = req.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request.uid is missing or not a string")
    return uid


def _request(req: dict[str, Any]) -> Request:
    """The engine's request (``req``: a dict, as parsed JSON is: compiled, its ``.get`` is a direct call
    where a ``Mapping``'s is a generic method lookup)."""
    kind = req.get("kind")
    if not isinstance(kind, dict) or not isinstance(kind.get("kind"), str) or not kind["kind"]:
        raise ReviewError("request.kind must be an object with group, version and kind")
    operation = req.get("operation")
    if operation not in OPERATIONS:
        raise ReviewError(f"request.operation must be one of {', '.join(OPERATIONS)}, got {value_text.shown(operation)}")
    obj, old = req.get("object"), req.get("oldObject")
    if operation in ("CREATE", "UPDATE") and not isinstance(obj, dict):
        raise ReviewError(f"request.object must be an object on {operation}")
    if operation == "UPDATE" and not isinstance(old, dict):
        raise ReviewError("request.oldObject must be an object on UPDATE")
    namespace, name, sub_resource = req.get("namespace"), req.get("name"), req.get("subResource")
    if not ((namespace is None or isinstance(namespace, str)) and (name is None or isinstance(name, str))
            and (sub_resource is None or isinstance(sub_resource, str))):
        for field, value in (("namespace", namespace), ("name", name), ("subResource", sub_resource)):
            if value is not None and not isinstance(value, str):
                raise ReviewError(f"request.{field} must be a string")
    # a frozen dataclass's own __init__ pays an object.__setattr__ call per field: its instance's fields
    # are given at once instead, as one dict (the same object: equal to the one __init__ builds)
    request = _new_object(Request)
    _set_attribute(request, "__dict__", {
        "operation": operation, "group": value_text.text(kind.get("group") or ""),
        "version": value_text.text(kind.get("version") or ""), "kind": kind["kind"],
        "namespace": namespace or "", "name": name or "",
        "object": obj if isinstance(obj, dict) else None, "old_object": old if isinstance(old, dict) else None,
        "sub_resource": sub_resource or "", "dry_run": bool(req.get("dryRun")), "user": _username(req),
    })
    return request


def _username(req: dict[str, Any]) -> str:
    """``userInfo.username``, "" when absent or not a string."""
    info = req.get("userInfo")
    name = info.get("username") if isinstance(info, dict) else None
    return name if isinstance(name, str) else ""


def build_response(review: Review, decision: Decision, *, mutating: bool) -> ReviewJSON:
    """The AdmissionReview answer: uid echoed, patch only when there is one."""
    response: ResponseJSON = {"uid": review.uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = _failure(403, "Forbidden", decision.message())
    elif mutating and decision.patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = encode_patch(decision.patch)
    warnings = limit_warnings(decision.warnings)
    if warnings:
        response["warnings"] = warnings
    if decision.findings:  # most admissions find nothing: no work for them
        audited = audit_findings(decision)
        if audited:
            response["auditAnnotations"] = {AUDIT_ANNOTATION: orjson.dumps(audited).decode()}
    if decision.exceptions:
        response.setdefault("auditAnnotations", {})[EXCEPTIONS_ANNOTATION] = ",".join(decision.exceptions)
    return {"apiVersion": review.api_version, "kind": "AdmissionReview", "response": response}


def audit_findings(decision: Decision) -> list[str]:
    """What the audit-mode rules found, "[policy/rule] message", within the warnings' limits.

    A JSON list in one annotation: the audit event keeps it as one string an operator
    greps for the rule, or reads with jq's ``fromjson``.
    """
    return limit_warnings(f.text() for f in decision.findings if f.audited)


def encode_patch(ops: Any) -> str:
    """A JSON patch as the base64 text of its JSON (pybase64: SIMD, ~0.3 µs where binascii
    takes ~4.5 µs for a 20-container pod's 5.5 KB patch)."""
    return _B64(encode(ops))


def encode(payload: object) -> bytes:
    """Compact JSON; keys that are not strings (from a policy's YAML) as their text."""
    try:
        return _DUMPS(payload)
    except orjson.JSONEncodeError:
        # OPT_NON_STR_KEYS makes every dump ~40% slower: only where a plain one fails
        return orjson.dumps(payload, option=orjson.OPT_NON_STR_KEYS)


def limit_warnings(warnings: Any) -> list[str]:
    """Each warning within 256 characters, all of them within 4096, as kube-apiserver keeps them."""
    if type(warnings) is tuple:  # (what decisions hold)
        if not warnings:  # (nearly every answer)
            return []
        if len(warnings) == 1:  # (nearly every answer that warns: one line, within the total)
            return [_normalized(warnings[0])]
    kept: list[str] = []
    total = 0
    for text in dict.fromkeys(warnings):
        one = _normalized(text)
        if total + len(one) > MAX_WARNINGS_TOTAL:
            break
        kept.append(one)
        total += len(one)
    return kept


def _normalized(text: object) -> str:
    """One warning as kube-apiserver keeps it: single-spaced, within MAX_WARNING_CHARS. Remembered
    per text, within a bound: the engine words the same few warnings over and over."""
    if type(text) is str:
        found = _NORMALIZED.get(text)
        if found is not None:
            return found
    one = _shorten(" ".join(str(text).split()))
    if type(text) is str and len(text) <= _NORMALIZED_CHARS and len(_NORMALIZED) < _NORMALIZED_SIZE:
        _NORMALIZED[text] = one
    return one


#: warnings normalized so far (a pure function of the text), at most _NORMALIZED_SIZE of at most _NORMALIZED_CHARS
_NORMALIZED: dict[str, str] = {}
_NORMALIZED_SIZE = 1024
_NORMALIZED_CHARS = 1024


def _shorten(one: str) -> str:
    """A warning over the limit loses its middle, not its end.

    A finding names the object first and says what to do last (and, on an
    UPDATE, that the object was already so): both must reach the user.
    """
    if len(one) <= MAX_WARNING_CHARS:
        return one
    head = (MAX_WARNING_CHARS - 1) // 2
    tail = MAX_WARNING_CHARS - 1 - head
    return one[:head] + "…" + one[len(one) - tail:]


def limit_message(text: str) -> str:
    """The denial message within MAX_MESSAGE_CHARS, cut at a line, saying how much was left out."""
    if len(text) <= MAX_MESSAGE_CHARS:
        return text
    kept = text[:MAX_MESSAGE_CHARS].rsplit("\n", 1)[0] or text[:MAX_MESSAGE_CHARS]
    rest = text[len(kept):].strip("\n")
    return f"{kept}\n… and {rest.count(chr(10)) + 1} more line(s) ({len(rest)} characters) not shown"


def error_body(message: str) -> dict[str, Any]:
    """A metav1.Status-shaped JSON body for 4xx answers."""
    return {"kind": "Status", "apiVersion": "v1", "status": "Failure", "message": message}
