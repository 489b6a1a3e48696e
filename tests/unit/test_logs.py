"""host/logs.py: both formats carry the incident's keys, and secrets do not pass either."""

from __future__ import annotations

import asyncio
import io
import json
import logging
from collections.abc import Iterator

import pytest

from engine_watchdog.host import logs

SECRET_LINE = "POST failed: Authorization: Bearer abcdefgh12345678 to http://u:pw123456@h:1/x"


@pytest.fixture
def handler() -> Iterator[logging.StreamHandler[io.StringIO]]:
    """A handler of the test's own on logger ``t``, INFO and above."""
    made = logging.StreamHandler(io.StringIO())
    logger = logging.getLogger("t")
    logger.addHandler(made)
    logger.setLevel(logging.INFO)
    try:
        yield made
    finally:
        logger.removeHandler(made)


def test_json_lines_carry_the_keys_bound_by_the_task_that_wrote_them(
    handler: logging.StreamHandler[io.StringIO],
) -> None:
    handler.setFormatter(logs.JsonFormatter())

    async def incident() -> None:
        logs.bind(engine="0", state="stalled", cause="no-progress", incident="i-1")
        logging.getLogger("t").warning("action capture: ok")

    async def target() -> None:
        logs.bind(target="http://127.0.0.1:8000")
        await asyncio.create_task(incident())  # the child inherits the target
        logging.getLogger("t").info("after the incident")

    asyncio.run(target())
    first, second = (json.loads(line) for line in handler.stream.getvalue().splitlines())
    assert first["target"] == "http://127.0.0.1:8000" and first["incident"] == "i-1"
    assert first["level"] == "warning" and first["msg"] == "action capture: ok"
    assert first["ts"].endswith("Z") and first["logger"] == "t"
    assert second["incident"] is None and second["target"] == "http://127.0.0.1:8000"


@pytest.mark.parametrize("as_json", [True, False], ids=["json", "text"])
def test_a_secret_in_a_message_is_redacted_in_both_formats(
    handler: logging.StreamHandler[io.StringIO], as_json: bool
) -> None:
    handler.setFormatter(logs.JsonFormatter() if as_json else logs.TextFormatter())
    logging.getLogger("t").error(SECRET_LINE)
    try:
        raise ValueError("x")
    except ValueError:
        logging.getLogger("t").exception("with a traceback")
    text = handler.stream.getvalue()
    assert "abcdefgh12345678" not in text and "pw123456" not in text
    if as_json:
        docs = [json.loads(line) for line in text.splitlines()]  # the traceback inside one line
        assert len(docs) == 2 and "ValueError" in docs[1]["exc"]


def test_run_modes_engine_output_becomes_records_only_in_json_mode() -> None:
    data = b"INFO ready\n\nWARNING slow\n"
    logs.configure(False)
    assert logs.engine_lines(data) == data
    logs.configure(True)
    try:
        docs = [json.loads(line) for line in logs.engine_lines(data).decode().splitlines()]
    finally:
        logs.configure(False)
    assert [d["msg"] for d in docs] == ["INFO ready", "WARNING slow"]
    assert {d["logger"] for d in docs} == {"engine"}
