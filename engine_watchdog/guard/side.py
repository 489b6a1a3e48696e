"""The engine connection's ``data_received``, the one callback every read of a stream runs:
compiled (guard/_side.c) where the package was built with a C compiler, this Python otherwise.

Both feed the read to httptools and pass the body on through ``_pass_on``
(guard/fast.py :class:`~engine_watchdog.guard.fast.EngineSide`). The compiled one does a
stream's steady event itself, without the interpreter: one whole SSE event in its read, with
the token key of the stream's last event, that is not the stream's first token, to a client
that is open. It then does what ``_pass_on`` and :meth:`GuardStats.note` do for that event, in
the same order, and anything else goes to ``_pass_on``. tests/unit/test_side.py replays the same
reads through both and compares every write and counter.

``ENGINE_WATCHDOG_PURE_PYTHON=1`` runs this Python even where the compiled one is built.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import httptools

PURE_ENV = "ENGINE_WATCHDOG_PURE_PYTHON"


class PySide:
    """``data_received`` in Python, with the attributes the compiled one reads (the subclass
    sets them all in its ``__init__``)."""

    _feed: Callable[[bytes], Any]
    """The response parser's ``feed_data``."""
    _ready: list[bytes]
    """Body pieces not yet passed on (the parser's ``on_body`` is this list's append)."""
    _client: Any
    """Where the body goes (guard/fast.py ``Client``), once the relay has started; else None."""
    failure: BaseException | None

    def data_received(self, data: bytes) -> None:
        try:
            self._feed(data)
        except (httptools.HttpParserUpgrade, httptools.HttpParserError) as exc:
            self._parse_failed(exc)
        if self._ready and self._client is not None and self.failure is None:
            self._pass_on()

    def _parse_failed(self, exc: Exception) -> None:
        raise NotImplementedError

    def _pass_on(self) -> None:
        raise NotImplementedError


def _compiled() -> type[PySide]:
    if os.environ.get(PURE_ENV, "") not in ("", "0"):
        return PySide
    try:
        from engine_watchdog.guard._side import Side as CSide
    except ImportError:  # built without a C compiler: the Python one
        return PySide
    return CSide  # type: ignore[return-value]


if TYPE_CHECKING:
    Side = PySide
else:
    Side = _compiled()
COMPILED = Side is not PySide
"""Whether the guard's reads run the compiled ``data_received``."""
