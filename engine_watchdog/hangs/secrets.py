"""A last line of defence before text leaves for a public issue tracker.

The bundle writer already redacts command lines and environments (docs/bundle.md), but the engine
log is copied as is and a bundle may come from an older or a foreign writer. Same word list as
the bundle's redaction: a flag or variable whose name holds TOKEN, KEY, SECRET, PASSWORD,
CREDENTIAL or AUTH (not TOKENIZER..., not ...TOKENS counts), ``user:password@`` in URLs, bearer
tokens and the common API-key shapes.
"""

from __future__ import annotations

import re

REDACTED = "<redacted>"
_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "CREDENTIAL", "AUTH")
_HARMLESS = ("TOKENIZER", "TOKENS")
_FLAG = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]*)(=|\s+)(?!-)(\S+)")
_ENV = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=(\S+)")
_URL = re.compile(r"(://)[^/@\s:]+:[^/@\s]+@")
_BEARER = re.compile(r"(?i)\b(bearer\s+)[\w.~+/=-]{8,}")
_KEYS = re.compile(r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,})\b")


def is_secret_name(name: str) -> bool:
    upper = name.upper().replace("-", "_")
    for harmless in _HARMLESS:
        upper = upper.replace(harmless, "_")
    return any(word in upper for word in _WORDS)


def scrub(text: str) -> str:
    """``text`` with secret-looking values replaced by ``<redacted>``."""
    text = _URL.sub(r"\1" + REDACTED + "@", text)
    text = _BEARER.sub(r"\1" + REDACTED, text)
    text = _KEYS.sub(REDACTED, text)
    text = _FLAG.sub(_flag, text)
    return _ENV.sub(_env, text)


def _flag(m: re.Match[str]) -> str:
    if not is_secret_name(m.group(1).lstrip("-")) or m.group(3) == REDACTED:
        return m.group(0)
    return f"{m.group(1)}{m.group(2)}{REDACTED}"


def _env(m: re.Match[str]) -> str:
    if not is_secret_name(m.group(1)) or m.group(2) == REDACTED:
        return m.group(0)
    return f"{m.group(1)}={REDACTED}"
