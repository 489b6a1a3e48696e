"""``nan`` and ``inf`` passed every number option (``--stall-seconds nan``
switched stall detection off without a word). Now every float option, from a flag or from its
ENGINE_WATCHDOG_* variable, must be finite and in range: one line naming the flag or the
variable, exit 64, before anything is probed."""

from __future__ import annotations

import os

import pytest

from engine_watchdog.cli.exits import EXIT_USAGE
from tests.tools.cli import run_cli_sync

OPTIONS = [
    "--stall-seconds",
    "--interval",
    "--suspect-seconds",
    "--canary-timeout",
    "--idle-canary-interval",
    "--request-stall-seconds",
    "--abort-grace",
    "--restart-backoff",
]
BAD = ["nan", "inf", "-inf", "1e999", "-1"]
TARGET = "http://127.0.0.1:9"  # nothing is ever sent: the value is refused first


def env_of(flag: str) -> str:
    return "ENGINE_WATCHDOG_" + flag.lstrip("-").upper().replace("-", "_")


def assert_refused(ran: object, name: str) -> None:
    code, err, out = ran.code, ran.err, ran.out  # type: ignore[attr-defined]
    assert code == EXIT_USAGE, (name, ran)
    (line,) = err.strip().splitlines()
    assert line.startswith(f"error: {name} must be "), line
    assert "Traceback" not in err and out == ""


@pytest.mark.parametrize("flag", OPTIONS)
@pytest.mark.parametrize("value", BAD)
def test_a_flag_that_is_not_a_finite_number_in_range_exits_64(flag: str, value: str) -> None:
    ran = run_cli_sync("watch", TARGET, "--listen", "", f"{flag}={value}", timeout=60)
    assert_refused(ran, flag)


@pytest.mark.parametrize("flag", OPTIONS)
def test_an_env_value_that_is_not_finite_names_the_variable(flag: str) -> None:
    env = {**os.environ, env_of(flag): "nan"}
    ran = run_cli_sync("watch", TARGET, "--listen", "", timeout=60, env=env)
    assert_refused(ran, env_of(flag))
    assert flag not in ran.err  # the ConfigMap's value is at fault, not a flag nobody gave


@pytest.mark.parametrize(
    ("args", "name"),
    [
        (("check", TARGET, "--timeout", "nan"), "--timeout"),
        (("capture", "--pid", "1", "--timeout", "inf"), "--timeout"),
        (("record", TARGET, "-o", "/tmp/never-written.jsonl", "--duration", "nan"), "--duration"),
    ],
)
def test_other_commands_numbers_are_checked_too(args: tuple[str, ...], name: str) -> None:
    assert_refused(run_cli_sync(*args, timeout=60), name)
