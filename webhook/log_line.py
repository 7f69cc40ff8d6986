"""A log line as bytes: its time, its JSON, and what the line per admission says.

Compiled with the policy core (webhook/compiled.py): every denied
admission makes one such line at the default log level (and every patched
one with ``serve --log-mutations``), and as
interpreted code (a fields map, then the formatter's entry, its clock and
its dump, each a frame of its own) it cost ~7 µs of a cold server's
request. ``webhook.logs`` (whose handler and formatters subclass
``logging``'s, which mypyc cannot compile) formats with these.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping
from typing import Any, Final

import orjson

from webhook import review
from webhook.policy.decision import Decision

MAX_MESSAGE_CHARS: Final = 2000
# (compiled, Final names are C statics: no read of orjson's attributes per line)
_DUMPS: Final = orjson.dumps
_APPEND_NEWLINE: Final = orjson.OPT_APPEND_NEWLINE


def cut(text: str, limit: int) -> str:
    """``text`` within ``limit`` characters, saying how many more there were."""
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


class Clock:
    """Record times as text, the part down to the second made once a second and the milliseconds
    looked up (a datetime per line cost a microsecond, and formatting the milliseconds as much again).
    ``utc``: ISO 8601 in UTC; else local time as logging's ``asctime``."""

    def __init__(self, utc: bool) -> None:
        self._utc = utc
        self._cache = (-1, "")  # (second, its text): one tuple, so threads never see half an update
        self._millis = tuple((".%03d+00:00" if utc else ",%03d") % n for n in range(1000))

    def text(self, created: float) -> str:
        second = int(created)
        cached, prefix = self._cache
        if second != cached:
            if self._utc:
                prefix = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(second))
            else:
                prefix = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(second))
            self._cache = (second, prefix)
        return prefix + self._millis[int((created - second) * 1000)]


def json_line(when: str, level: object, logger: object, msg: str, fields: Mapping[str, Any]) -> bytes:
    """One JSON line (newline included): ``time``, ``level``, ``logger``, ``msg`` (cut at
    MAX_MESSAGE_CHARS), then ``fields``. ``level`` and ``logger`` as a LogRecord holds them: any
    value (``logging.makeLogRecord`` leaves the name None)."""
    if len(msg) > MAX_MESSAGE_CHARS:
        msg = cut(msg, MAX_MESSAGE_CHARS)
    entry: dict[str, Any] = {"time": when, "level": level, "logger": logger, "msg": msg}
    entry.update(fields)
    return dumps(entry)


def dumps(entry: dict[str, Any]) -> bytes:
    """``entry`` as a JSON line, whatever its values: orjson, else json escaping what orjson refuses,
    else its four first keys and the names of the fields that could not be written."""
    try:
        return _DUMPS(entry, default=str, option=_APPEND_NEWLINE)
    except TypeError:  # a lone surrogate (orjson writes only valid UTF-8), a key that is no string
        pass
    try:
        return (json.dumps(entry, ensure_ascii=True, default=str) + "\n").encode()
    except (ValueError, TypeError, RecursionError) as exc:  # a field nested past any reason
        short = {k: entry[k] for k in ("time", "level", "logger", "msg")}
        short["unlogged_fields"] = f"{type(exc).__name__}: {sorted(map(str, entry))}"
        return (json.dumps(short, ensure_ascii=True, default=str) + "\n").encode()


def decision_fields(endpoint: str, parsed: review.Review, decision: Decision, outcome: str) -> tuple[str, dict[str, Any]]:
    """What the line per admission says of ``decision`` (its ``outcome``: "patch", "deny", "error",
    "audit", "warn" or "allow"): the text after the outcome, and the line's fields."""
    req = parsed.request
    fields: dict[str, Any] = {
        "uid": parsed.uid, "kind": req.kind, "operation": req.operation, "namespace": req.namespace,
        "object": req.name, "endpoint": endpoint, "verdict": outcome, "rules": _rules(decision),
    }
    return _text(decision, outcome), fields


def decision_line(when: str, level: str, logger: str, endpoint: str, parsed: review.Review, decision: Decision,
                  outcome: str) -> bytes:
    """The JSON line per admission, newline included: what ``json_line(when, level, logger, f"{outcome}: {text}",
    fields)`` makes of ``decision_fields``, byte for byte, built as one map (the line's keys in its order)
    rather than a map of fields copied into the line's (-3,200 instructions of ~314,000 per patched
    admission of the training pod logged at INFO, bench/instructions.py)."""
    msg = outcome + ": " + _text(decision, outcome)
    if len(msg) > MAX_MESSAGE_CHARS:
        msg = cut(msg, MAX_MESSAGE_CHARS)
    req = parsed.request
    return dumps({
        "time": when, "level": level, "logger": logger, "msg": msg,
        "uid": parsed.uid, "kind": req.kind, "operation": req.operation, "namespace": req.namespace,
        "object": req.name, "endpoint": endpoint, "verdict": outcome, "rules": _rules(decision),
    })


def _text(decision: Decision, outcome: str) -> str:
    """The line's text after its outcome."""
    if outcome == "deny" or outcome == "error":
        return decision.message() or "; ".join(decision.warnings)
    if outcome == "audit":
        return "; ".join(review.audit_findings(decision))
    # a patch (the warning says what was mutated), or what was allowed and warned about
    return "; ".join(decision.warnings)


def _rules(decision: Decision) -> list[str]:
    """The rules the line names: those with a finding, as policy/rule, sorted."""
    findings = decision.findings
    if not findings:
        return []
    return sorted({f.policy + "/" + f.rule for f in findings})
