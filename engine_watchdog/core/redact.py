"""Secrets out of everything the watchdog keeps: environment variables and flags whose names
say secret, and passwords inside URLs. Pure; applied where a command line or a URL enters."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL", "AUTH")
# Counts, not secrets: "max-num-batched-tokens", TOKENIZERS_PARALLELISM would hide useful facts.
_HARMLESS = ("TOKENIZER", "TOKENS")
REDACTED = "<redacted>"
_URL_USERINFO = re.compile(r"(://)[^/@\s:]+:[^/@\s]+@")


def is_secret_name(name: str) -> bool:
    """True for env or flag names that may carry a secret (HF_TOKEN, --api-key, AUTH_HEADER)."""
    upper = name.upper().replace("-", "_")
    for harmless in _HARMLESS:
        upper = upper.replace(harmless, "_")
    return any(word in upper for word in SECRET_WORDS)


def _scrub(value: str) -> str:
    """Hide passwords inside URLs (scheme://user:pass@host)."""
    return _URL_USERINFO.sub(r"\1" + REDACTED + "@", value)


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    return {k: REDACTED if is_secret_name(k) else _scrub(v) for k, v in sorted(env.items())}


def redact_argv(argv: Sequence[str]) -> list[str]:
    """Hide the values of secret flags (``--api-key X`` and ``--api-key=X``)."""
    out: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next and not arg.startswith("-"):
            out.append(REDACTED)
            hide_next = False
            continue
        hide_next = False
        flag, eq, _value = arg.partition("=")
        if arg.startswith("-") and is_secret_name(flag.lstrip("-")):
            if eq:
                out.append(f"{flag}={REDACTED}")
                continue
            hide_next = True
        out.append(_scrub(arg))
    return out
