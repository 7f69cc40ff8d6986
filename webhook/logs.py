"""Log setup of the server: one line per record, bounded, and never a blocking write on the thread that logs.

Lines are JSON objects (``--log-format json``, the default when stderr is
not a terminal, as in a pod) or text for a person (``text``, the default
on a terminal, as `make serve` runs). Fields passed with ``extra=`` (uid,
kind, namespace, name, verdict, rules…) become keys of a JSON line and
``key=value`` pairs at the end of a text line. A message is cut at
``MAX_MESSAGE_CHARS`` (one request must not write megabytes), and a lone
surrogate from a request is escaped rather than breaking the line.

``configure`` sends every record to a :class:`~webhook.log_output.LogOutput`:
the line goes into a bounded buffer that a thread writes to stderr, so a
stalled reader of stderr costs dropped (and counted) lines, never a stalled
event loop. Making a line costs a few microseconds: orjson, no datetime
object per line (the date and time part is made once a second), and for
the one line per admission no ``LogRecord`` either (``Output.fields``; in
JSON, ``log_line.decision_line`` makes it in one piece).
"""

from __future__ import annotations

import logging
import os
import time
import traceback
from collections.abc import Mapping
from typing import Any, Final

from aiohttp import http_exceptions

from webhook.log_line import MAX_MESSAGE_CHARS, Clock, cut, json_line
from webhook.log_output import BATCH_SECONDS, LogOutput

MAX_TRACEBACK_CHARS = 8000
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName"}
FORMATS = ("auto", "json", "text")
_STDERR = 2
#: seconds ``Output.close`` waits for a stalled output at exit before giving up its lines
CLOSE_TIMEOUT = 2.0


def _extras(record: logging.LogRecord) -> dict[str, Any]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD and k[0] != "_"}


def _error(record: logging.LogRecord) -> tuple[str, str] | None:
    if not record.exc_info or record.exc_info[1] is None:
        return None
    exc = record.exc_info[1]
    text = "".join(traceback.format_exception(*record.exc_info))
    return cut(f"{type(exc).__name__}: {exc}", MAX_MESSAGE_CHARS), cut(text, MAX_TRACEBACK_CHARS)


class JsonFormatter(logging.Formatter):
    """A log record as one line of JSON: ``time``, ``level``, ``logger``, ``msg``, then its fields."""

    def __init__(self) -> None:
        super().__init__()
        #: the lines' times (the line per admission is made from it: webhook.server.handlers)
        self.clock = Clock(utc=True)

    def format(self, record: logging.LogRecord) -> str:
        return self.line(record).decode().rstrip("\n")

    def line(self, record: logging.LogRecord) -> bytes:
        """The record's line, newline included."""
        fields = _extras(record)
        error = _error(record)
        if error is not None:
            fields["error"], fields["traceback"] = error
        return self.fields_line(record.created, record.levelname, record.name, record.getMessage(), fields)

    def fields_line(self, created: float, level: str, logger: str, msg: str, fields: Mapping[str, Any]) -> bytes:
        """What ``line`` gives for a record of these attributes and ``extra=fields``, without the record."""
        return json_line(self.clock.text(created), _LOWER.get(level) or level.lower(), logger, msg, fields)


_LOWER: Final = {name: name.lower() for name in ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")}
_NAMES: Final = {getattr(logging, name): name for name in _LOWER}


class TextFormatter(logging.Formatter):
    """The format for a person: time, level, logger, message, then the record's fields as key=value;
    bounded and escaped like the JSON one."""

    def __init__(self) -> None:
        super().__init__()
        self._clock = Clock(utc=False)

    def format(self, record: logging.LogRecord) -> str:
        return self.line(record).decode().rstrip("\n")

    def line(self, record: logging.LogRecord) -> bytes:
        error = _error(record)
        text = self._text(record.created, record.levelname, record.name, record.getMessage(), _extras(record))
        if error is not None:
            text += "\n" + error[1].rstrip("\n")
        return text.encode("ascii", "backslashreplace") + b"\n"

    def fields_line(self, created: float, level: str, logger: str, msg: str, fields: Mapping[str, Any]) -> bytes:
        return self._text(created, level, logger, msg, fields).encode("ascii", "backslashreplace") + b"\n"

    def _text(self, created: float, level: str, logger: str, msg: str, fields: Mapping[str, Any]) -> str:
        text = f"{self._clock.text(created)} {level} {logger}: {cut(msg, MAX_MESSAGE_CHARS)}"
        if not fields:
            return text
        return text + " [" + " ".join(f"{key}={_plain(value)}" for key, value in fields.items()) + "]"


def _plain(value: object) -> str:
    if isinstance(value, (list, tuple)):
        return ",".join(str(v) for v in value)
    return cut(str(value), 200)


class Output(logging.Handler):
    """The handler ``configure`` installs: each record formatted on the thread that logs (a few
    microseconds) and handed to a LogOutput, which writes it from a thread of its own."""

    def __init__(self, formatter: JsonFormatter | TextFormatter, fd: int, batch: float = BATCH_SECONDS) -> None:
        super().__init__()
        self.formatter: JsonFormatter | TextFormatter = formatter
        self.lines = LogOutput(fd, self._notice, batch=batch)

    @property
    def dropped(self) -> int:
        """Lines dropped so far because the output did not take them."""
        return self.lines.dropped

    def handle(self, record: logging.LogRecord) -> bool:  # type: ignore[override]
        # (without the handler's lock, which logging takes around emit: LogOutput has its own)
        if self.filters and not self.filter(record):
            return False
        self.emit(record)
        return True

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.formatter.line(record)
        except Exception as exc:  # a bad format string or argument: say so, never a traceback on stderr
            line = self.formatter.fields_line(
                record.created, "ERROR", record.name, f"unformattable log record: {type(exc).__name__}: {exc}",
                {"template": cut(str(record.msg), 200)},
            )
        self.lines.write(line)

    def fields(self, logger: logging.Logger, level: int, msg: str, fields: Mapping[str, Any]) -> None:
        """The line ``logger.log(level, msg, extra=fields)`` would write through this handler, without a
        LogRecord (~3 µs of the logging machinery). For the server's line per admission in text (in JSON the
        server makes it with ``log_line.decision_line`` and writes it to ``lines`` itself), where this handler
        is the only one (``configure`` installed it); the caller checked ``logger.isEnabledFor(level)``."""
        self.lines.write(self.formatter.fields_line(time.time(), _NAMES.get(level) or logging.getLevelName(level), logger.name, msg, fields))

    def flush(self) -> None:
        self.lines.flush(CLOSE_TIMEOUT)

    def close(self) -> None:
        self.lines.close(CLOSE_TIMEOUT)
        super().close()

    def _notice(self, dropped: int) -> bytes:
        return self.formatter.fields_line(
            time.time(), "WARNING", __name__,
            f"{dropped} log lines dropped: the log output (stderr) did not take them in time", {"dropped": dropped},
        )


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
    return cut(" ".join(str(exc.message or exc).split()), 200)


def quiet_protocol_errors() -> None:
    """Install the ProtocolErrors filter once."""
    server = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, ProtocolErrors) for f in server.filters):
        server.addFilter(ProtocolErrors())


def configure(level: str, fmt: str = "auto") -> Output:
    """Log to stderr at ``level`` through an Output, in ``fmt``: "json", "text", or "auto" (text on a terminal, else JSON).

    Neither format shows the caller's file and line, thread or process, so
    records are made without looking them up (the logging HOWTO's
    "Optimization"). Warnings go through logging too: ``warnings`` would
    write them to stderr itself, with a blocking write.
    """
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    logging._srcfile = None  # no sys._getframe walk per record
    if fmt == "auto":
        fmt = "text" if os.isatty(_STDERR) else "json"
    output = Output(JsonFormatter() if fmt == "json" else TextFormatter(), _STDERR)
    logging.basicConfig(level=level, handlers=[output], force=True)
    logging.captureWarnings(True)
    quiet_protocol_errors()
    # the kubernetes client's urllib3 retries each failed call and says so at WARNING, three lines
    # a second while the API server is away; the watch's own line says the same once per backoff
    logging.getLogger("urllib3.connectionpool").setLevel(logging.DEBUG if level == "DEBUG" else logging.ERROR)
    return output
