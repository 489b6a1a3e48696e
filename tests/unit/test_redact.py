"""core/redact.py, the one redaction module, over every form in tests/data/bad_input/secrets.json
(the real-process test, tests/integration/test_secrets.py, shows where it is applied)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from engine_watchdog.core.redact import (
    REDACTED,
    Masker,
    redact_argv,
    redact_text,
    redact_url,
    secret_values,
)

FIX: dict[str, Any] = json.loads(
    (Path(__file__).resolve().parents[1] / "data" / "bad_input" / "secrets.json").read_text()
)


def leaked(text: str) -> list[str]:
    return [s for s in FIX["secrets"] if s in text]


@pytest.mark.parametrize("key", ["engine_argv", "shell_argv", "env_prefix"])
def test_no_form_of_secret_survives_a_command_line(key: str) -> None:
    shown = redact_argv(FIX[key])
    assert not leaked(" ".join(shown)), shown
    assert len(shown) == len(FIX[key])  # one argument for one: positions still mean something


def test_redaction_hides_values_not_the_facts_around_them() -> None:
    shown = redact_argv(FIX["engine_argv"])
    assert shown[2:5] == ["--api-key", REDACTED, REDACTED]  # vLLM's --api-key takes several
    assert shown[5:7] == ["--max-num-batched-tokens", "8192"]
    assert all(kept in shown for kept in FIX["kept"])
    assert redact_argv(["sh", "-c", "vllm serve m --api-key A1b2C3d4 B5c6D7e8 --port 8000"])[2] == (
        f"vllm serve m --api-key {REDACTED} {REDACTED} --port 8000"
    )


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://u:pw@127.0.0.1:8000", f"http://{REDACTED}@127.0.0.1:8000"),
        ("https://ghp_token@example.com/x", f"https://{REDACTED}@example.com/x"),
        ("http://127.0.0.1:8000", "http://127.0.0.1:8000"),
        ("http://h/path?mail=a@b", "http://h/path?mail=a@b"),
    ],
)
def test_url_userinfo(url: str, shown: str) -> None:
    assert redact_url(url) == shown


def test_masker_hides_known_values_in_any_shape_of_output() -> None:
    """An engine prints its arguments its own way: a Python list, a repr of its namespace."""
    argv = [*FIX["env_prefix"], "vllm", "serve", *FIX["engine_argv"]]
    masker = Masker(secret_values(argv, {"HF_TOKEN": "hf_fromEnvironmentOfOurs"}))
    printed = f"args: {argv!r}; Namespace(api_key={FIX['secrets'][:2]!r}) hf_fromEnvironmentOfOurs"
    assert not leaked(masker.text(printed)) and "hf_fromEnvironmentOfOurs" not in masker.text(
        printed
    )
    assert masker.data(b"\xff not utf-8 " + FIX["secrets"][0].encode()) == b"\xff not utf-8 " + (
        REDACTED.encode()
    )


def test_free_text_keeps_counts_and_hides_members() -> None:
    assert redact_text("max_tokens=16 --max-num-batched-tokens 8192") == (
        "max_tokens=16 --max-num-batched-tokens 8192"
    )
    assert redact_text("non-default args: {'api_key': ['K1', 'K2'], 'model': 'm'}") == (
        f"non-default args: {{'api_key': '{REDACTED}', 'model': 'm'}}"
    )
