"""Options from the environment, as the Kubernetes sidecar gets them (a ConfigMap through
envFrom): ``--help`` names each option's variable, and a bad value read from one is one line
naming the variable (not a flag nobody typed), exit 64, no traceback; for every kind of option."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from engine_watchdog.cli.main import cli
from tests.tools.cli import run_cli_sync

WATCH = ("watch", "http://127.0.0.1:9", "--listen", "")
CASES = {
    "number": ("STALL_SECONDS", "abc", "--stall-seconds"),
    "integer": ("MAX_RESTARTS", "many", "--max-restarts"),
    "choice": ("ENGINE", "bogus", "--engine"),
    "boolean flag": ("TAR", "maybe", "--tar"),
    "boolean pair": ("CANARY", "maybe", "--canary"),
    "directory": ("INCIDENT_DIR", "{file}", "--incident-dir"),
    "file": ("ENGINE_LOG", "{dir}", "--engine-log"),
    "converted list": ("ACTION", "capture,bogus", "--action"),
    "file read at start": ("API_KEY_FILE", "{dir}/missing", "--api-key-file"),
    "targets file": ("TARGETS", "{dir}/missing", "--targets"),
}


@pytest.mark.parametrize("kind", list(CASES))
def test_a_bad_value_from_the_environment_names_the_variable(kind: str, tmp_path: Path) -> None:
    name, value, flag = CASES[kind]
    (tmp_path / "a-file").write_text("")
    var = f"ENGINE_WATCHDOG_{name}"
    env = dict(os.environ, **{var: value.format(file=tmp_path / "a-file", dir=tmp_path)})
    ran = run_cli_sync(*WATCH, env=env, timeout=30)
    assert ran.code == 64, ran.err
    lines = ran.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), ran.err
    assert var in lines[0] and flag not in lines[0], lines[0]


def test_in_json_mode_the_error_is_a_json_line_naming_the_variable() -> None:
    env = dict(os.environ, ENGINE_WATCHDOG_JSON="true", ENGINE_WATCHDOG_STALL_SECONDS="nan")
    ran = run_cli_sync(*WATCH, env=env, timeout=30)
    assert ran.code == 64, ran.err
    [line] = ran.err.strip().splitlines()
    doc = json.loads(line)
    assert doc["level"] == "error" and "ENGINE_WATCHDOG_STALL_SECONDS" in doc["msg"], doc


def test_a_bad_flag_still_names_the_flag() -> None:
    ran = run_cli_sync(*WATCH, "--engine", "bogus", timeout=30)
    assert ran.code == 64 and ran.err.startswith("error: Invalid value for '--engine'"), ran.err


@pytest.mark.parametrize("command", ["watch", "run", "guard", "check"])
def test_help_names_every_options_variable(command: str) -> None:
    ran = run_cli_sync(command, "--help", timeout=30)
    assert ran.code == 0, ran.err
    shown = " ".join(ran.out.split())  # click wraps the help text
    params = cli.commands[command].params
    for param in params:
        if param.param_type_name == "option" and param.envvar and param.name != "help":
            assert f"env var: {param.envvar}" in shown, param.name
