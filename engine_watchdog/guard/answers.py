"""The answers the guard gives in the engine's place, shaped as vLLM's own.

vLLM ends a stream that fails with an error event and then ``data: [DONE]``
(vllm/entrypoints/openai/completion/serving.py, ``completion_stream_generator``: the
``create_streaming_error_response`` JSON); a request that fails before it streams gets that
JSON as the body. A request vLLM may retry elsewhere is a ``ServiceUnavailableError`` with code
503 (vllm/entrypoints/serve/exception_handling/error_response.py, ``RetryableRequestError``).
"""

from __future__ import annotations

import json
from enum import Enum
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from aiohttp import web

DONE = b"data: [DONE]\n\n"


class Ending(str, Enum):
    """Why the guard ended a request itself (also its outcome label in the metrics)."""

    STUCK = "aborted-stuck"
    """The request judge found this stream stuck while the others move."""
    STALL = "answered-stall"
    """The engine is stalled: every request in flight is answered."""
    SHUTDOWN = "ended-shutdown"
    """The guard stopped (SIGTERM) and the drain budget ran out before the request ended."""


MESSAGES = {
    Ending.STUCK: "engine-watchdog: this request got no token for {silent:.0f} s while the "
    "engine served the others; it was aborted. Retry it.",
    Ending.STALL: "engine-watchdog: the engine stopped making progress ({cause}); this request "
    "was ended so that it can be retried elsewhere.",
}


def error_doc(message: str, status: int = 503, kind: str = "ServiceUnavailableError") -> bytes:
    body = {"error": {"message": message, "type": kind, "param": None, "code": status}}
    return json.dumps(body, separators=(",", ":")).encode()


def sse_error(message: str, complete: bool) -> bytes:
    """The end of a stream: an error event, then [DONE]. ``complete``: the stream so far ended
    on an event boundary (otherwise the partial event is closed first, so the error is read as
    an event of its own)."""
    lead = b"" if complete else b"\n\n"
    return lead + b"data: " + error_doc(message) + b"\n\n" + DONE


def json_error(
    message: str, status: int = 503, kind: str = "ServiceUnavailableError", retry_after: int = 0
) -> web.Response:
    # aiohttp's server imported here, by the guard only: the supervisor reads this module's
    # MESSAGES in every watch, which serves nothing through aiohttp.web (runtime/endpoints.py).
    from aiohttp import web

    headers = {"Retry-After": str(retry_after)} if retry_after else {}
    return web.Response(
        body=error_doc(message, status, kind),
        status=status,
        content_type="application/json",
        headers=headers,
    )
