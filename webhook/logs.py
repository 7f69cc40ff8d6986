"""Log setup of the server: one JSON object per line, bounded, never a traceback for bad input.

Fields passed with ``extra=`` (uid, kind, namespace, name, verdict, rules…)
become keys of the line. Every line is ASCII-escaped (a lone surrogate from
a request cannot break the stream) and its message is cut at
``MAX_MESSAGE_CHARS``: one request must not write megabytes.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import sys
import traceback
from typing import Any

from aiohttp import http_exceptions

MAX_MESSAGE_CHARS = 2000
MAX_TRACEBACK_CHARS = 8000
_STANDARD = set(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit] + f"… ({len(text) - limit} more characters)"


class JsonFormatter(logging.Formatter):
    """A log record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "time": dt.datetime.fromtimestamp(record.created, dt.timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _cut(record.getMessage(), MAX_MESSAGE_CHARS),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                entry[key] = value
        if record.exc_info and record.exc_info[1] is not None:
            entry["error"] = _cut(f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}", MAX_MESSAGE_CHARS)
            entry["traceback"] = _cut("".join(traceback.format_exception(*record.exc_info)), MAX_TRACEBACK_CHARS)
        return json.dumps(entry, ensure_ascii=True, default=str)


class TextFormatter(logging.Formatter):
    """The human-readable format, bounded and escaped like the JSON one."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")

    def format(self, record: logging.LogRecord) -> str:
        text = _cut(super().format(record), MAX_MESSAGE_CHARS + MAX_TRACEBACK_CHARS)
        return text.encode("ascii", "backslashreplace").decode("ascii")


class ProtocolErrors(logging.Filter):
    """aiohttp logs each malformed HTTP request with a traceback at ERROR: make it one INFO line."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, http_exceptions.HttpProcessingError):
            peer = record.args[0] if isinstance(record.args, tuple) and record.args else "?"
            record.msg, record.args = "malformed HTTP request from %s: %s", (peer, _short(exc))
            record.exc_info, record.exc_text = None, None
            if record.levelno > logging.INFO:
                record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def _short(exc: http_exceptions.HttpProcessingError) -> str:
    return _cut(" ".join(str(exc.message or exc).split()), 200)


def quiet_protocol_errors() -> None:
    """Install the ProtocolErrors filter once."""
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, ProtocolErrors) for f in server.filters):
        server.addFilter(ProtocolErrors())


def configure(level: str, fmt: str = "json") -> None:
    """Log to stderr in ``fmt`` ("json" or "text") at ``level``.

    Neither format shows the caller's file and line, thread or process, so
    records are made without looking them up (the logging HOWTO's
    "Optimization"): at INFO every patch and denial is a line, and those
    look-ups were a third of its cost.
    """
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None  # no sys._getframe walk per record
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    logging.basicConfig(level=level, handlers=[handler], force=True)
    quiet_protocol_errors()
    # the kubernetes client's urllib3 retries each failed call and says so at WARNING, three lines
    # a second while the API server is away; the watch's own line says the same once per backoff
    logging.getLogger("urllib3.connectionpool").setLevel(logging.DEBUG if level == "DEBUG" else logging.ERROR)
