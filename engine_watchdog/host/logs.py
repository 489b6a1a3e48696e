"""The one format of every line the process writes: readable text, or one JSON object a line
(--json) that Loki and Elasticsearch index without a parsing rule.

A JSON line always has ``ts`` (RFC 3339, UTC), ``level``, ``logger``, ``msg`` and the incident's
keys ``target``, ``engine``, ``state``, ``cause``, ``incident`` (null where not known). Those keys
come from a context variable (:func:`bind`): a target's tasks bind ``target``, an incident's task
binds the rest, and every log line written inside them (the ladder's, an action's, a capture
step's) carries them without passing them around. Messages go through
:func:`~engine_watchdog.core.redact.redact_text` once more on the way out: a secret that slipped
past where it entered still does not reach a log shipper.
"""

from __future__ import annotations

import contextvars
import json
import logging
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import datetime, timezone
from types import MappingProxyType
from typing import Any

from engine_watchdog.core.redact import redact_text

KEYS = ("target", "engine", "state", "cause", "incident")
"""Where known, every JSON line says which engine and which incident it is about."""
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
_context: contextvars.ContextVar[Mapping[str, str | None]] = contextvars.ContextVar(
    "engine_watchdog_log_context", default=MappingProxyType({})
)
_json = False
_own: list[logging.Handler] = []
"""The handlers :func:`configure` made (and so formats)."""


def bind(**fields: str | None) -> None:
    """Add ``fields`` to this task's log context (its child tasks inherit it: a copy)."""
    _context.set({**_context.get(), **fields})


@contextmanager
def bound(**fields: str | None) -> Iterator[None]:
    """``fields`` in the log context for the ``with`` block only."""
    token = _context.set({**_context.get(), **fields})
    try:
        yield
    finally:
        _context.reset(token)


def context() -> dict[str, str | None]:
    """The five keys, each as bound or None."""
    now = _context.get()
    return {key: now.get(key) for key in KEYS}


def timestamp(t: float) -> str:
    """``2026-12-03T06:40:01.123Z``: what Loki, Elasticsearch and jq's ``fromdate`` take."""
    when = datetime.fromtimestamp(t, timezone.utc)
    return when.strftime("%Y-%m-%dT%H:%M:%S.") + f"{when.microsecond // 1000:03d}Z"


def json_line(
    t: float, level: str, logger: str, msg: str, fields: Mapping[str, Any] | None = None
) -> str:
    """One JSON line: the common keys first, the context's keys, then ``fields`` over them."""
    record: dict[str, Any] = {"ts": timestamp(t), "level": level, "logger": logger}
    record["msg"] = redact_text(msg)
    record.update(context())
    record.update(fields or {})
    return json.dumps(record, separators=(",", ":"), default=str, ensure_ascii=False)


class JsonFormatter(logging.Formatter):
    """A log record as one JSON line; a traceback (-v) goes into ``exc``, never onto lines of
    its own."""

    def format(self, record: logging.LogRecord) -> str:
        fields: dict[str, Any] = {}
        if record.exc_info:
            fields["exc"] = self.formatException(record.exc_info)
        level = record.levelname.lower()
        return json_line(record.created, level, record.name, record.getMessage(), fields)


class TextFormatter(logging.Formatter):
    """The readable line, with the engine and the incident when they are known."""

    def __init__(self) -> None:
        super().__init__(TEXT_FORMAT)

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:
        return timestamp(record.created)  # UTC, as in JSON mode: one clock in every line

    def format(self, record: logging.LogRecord) -> str:
        shown = logging.makeLogRecord(record.__dict__)  # other handlers see the record as it is
        shown.msg, shown.args = redact_text(record.getMessage()), None
        line = super().format(shown)
        now = context()
        where = [f"{k}={now[k]}" for k in ("engine", "incident") if now[k] is not None]
        return f"{line} [{' '.join(where)}]" if where else line


def configure(as_json: bool, verbose: bool | None = None) -> None:
    """Every log line on stderr in one format (called again once a command knows --json;
    ``verbose`` None: the level stays as it is). Like ``logging.basicConfig``, a root logger that
    has handlers already (an embedding program's, pytest's) keeps them as they are."""
    global _json
    _json = as_json
    root = logging.getLogger()
    if not root.handlers:
        _own.append(logging.StreamHandler(sys.stderr))
        root.addHandler(_own[-1])
    if verbose is not None:
        root.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.captureWarnings(True)  # a Python warning is a log line too, not a stray one
    for handler in _own:
        handler.setFormatter(JsonFormatter() if as_json else TextFormatter())


def error_line(message: str) -> str:
    """The one line a command ends with on bad input, in the process's format."""
    if not _json:
        return f"error: {message}"
    return json_line(time.time(), "error", "engine_watchdog.cli", message)


def engine_lines(data: bytes) -> bytes:
    """Run mode: the engine's output (whole lines, masked already) for our stderr; in JSON mode
    each line becomes a record of logger ``engine``."""
    if not _json:
        return data
    now = time.time()
    lines = data.decode("utf-8", "replace").splitlines()
    shaped = [json_line(now, "info", "engine", line) for line in lines if line.strip()]
    return "".join(line + "\n" for line in shaped).encode()
