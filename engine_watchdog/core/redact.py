"""Secrets out of everything the watchdog keeps and says: the one redaction module. Pure.

Applied once, where a secret can enter: a process's command line (the process table the probes
read, the bundle's process records), supervise mode's engine command, an engine's environment,
the URLs given on the command line (targets, Alertmanager). What is hidden (docs/reliability.md):

- the values of flags and variables whose names say secret (TOKEN, KEY, SECRET, PASSWORD,
  PASSWD, PASSPHRASE, CREDENTIAL, AUTH, COOKIE; not TOKENIZER... nor ...TOKENS, which are
  counts): ``--api-key K1 K2`` (every value up to the next flag: vLLM's --api-key takes
  several), ``--hf-token=X``, ``-client-secret X``, ``-Dstore.password=X``, and ``NAME=X`` as
  in ``env HF_TOKEN=X vllm serve``;
- any userinfo in a URL (``https://user:password@host``, ``https://token@host``);
- bearer and basic credentials, the common API-key shapes (sk-..., hf_..., ghp_..., AKIA...,
  JWTs), and JSON or Python members with secret names (``"api_key": "X"``) anywhere;
- an argument that is itself a command line (``sh -c "vllm serve --api-key X"``) word by word.

Output whose format is unknown (an engine's own log) goes through a :class:`Masker`: the exact
values hidden from the engine's command line and environment, and then :func:`redact_text`.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping, Sequence

REDACTED = "<redacted>"
SECRET_WORDS = (
    "TOKEN",
    "KEY",
    "SECRET",
    "PASSWORD",
    "PASSWD",
    "PASSPHRASE",
    "CREDENTIAL",
    "AUTH",
    "COOKIE",
)
# Counts, not secrets: "max-num-batched-tokens", TOKENIZERS_PARALLELISM would hide useful facts.
_HARMLESS = ("TOKENIZER", "TOKENS")
MIN_MASKED_CHARS = 6
"""Known secret values shorter than this are not masked in free text (they would garble it)."""

_USERINFO = re.compile(r"(://)[^/@\s]+@")
_CREDENTIAL = re.compile(r"(?i)\b((?:bearer|basic)\s+)[\w.~+/=-]{8,}")
_KEY_SHAPES = re.compile(
    r"\b(?:hf_[A-Za-z0-9]{20,}|sk-[A-Za-z0-9_-]{16,}|gh[pousr]_[A-Za-z0-9]{20,}"
    r"|AKIA[0-9A-Z]{16}|eyJ[\w-]{8,}\.[\w-]{8,}\.[\w-]{8,})"
)
_MEMBER = re.compile(r"""(["'])([A-Za-z_][\w.-]*)\1(\s*:\s*)(\[[^\]]*\]|"[^"]*"|'[^']*')""")
_FLAG_TEXT = re.compile(r"(?<![\w-])(--?[A-Za-z][\w.-]*)(=|\s+)(?!-)(\S+)")
_ASSIGN_TEXT = re.compile(r"\b([A-Za-z_][A-Za-z0-9_]*)=(\S+)")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def is_secret_name(name: str) -> bool:
    """True for env or flag names that may carry a secret (HF_TOKEN, --api-key, AUTH_HEADER)."""
    upper = name.upper().replace("-", "_").replace(".", "_")
    for harmless in _HARMLESS:
        upper = upper.replace(harmless, "_")
    return any(word in upper for word in SECRET_WORDS)


def redact_url(url: str) -> str:
    """``scheme://user:password@host...`` -> ``scheme://<redacted>@host...`` (still a URL)."""
    return _USERINFO.sub(r"\1" + REDACTED + "@", url)


def redact_text(text: str) -> str:
    """Free text (a log line, a report) with secret-looking values replaced by <redacted>."""
    text = redact_url(text)
    text = _CREDENTIAL.sub(r"\1" + REDACTED, text)
    text = _KEY_SHAPES.sub(REDACTED, text)
    text = _MEMBER.sub(_member, text)
    text = _FLAG_TEXT.sub(_flag_text, text)
    return _ASSIGN_TEXT.sub(_assign_text, text)


def _member(m: re.Match[str]) -> str:
    if not is_secret_name(m.group(2)):
        return m.group(0)
    quote = m.group(1)
    return f"{quote}{m.group(2)}{quote}{m.group(3)}{quote}{REDACTED}{quote}"


def _flag_text(m: re.Match[str]) -> str:
    if not is_secret_name(m.group(1).lstrip("-")) or m.group(3).startswith(REDACTED):
        return m.group(0)
    return f"{m.group(1)}{m.group(2)}{REDACTED}"


def _assign_text(m: re.Match[str]) -> str:
    if not is_secret_name(m.group(1)) or m.group(2).startswith(REDACTED):
        return m.group(0)
    return f"{m.group(1)}={REDACTED}"


def _is_flag(arg: str) -> bool:
    return len(arg) > 1 and arg.startswith("-") and not arg[1:2].isdigit()


def _argv_parts(argv: Iterable[str]) -> Iterator[tuple[str, str | None]]:
    """(argument as shown, the secret it hid or None), argument by argument."""
    hiding = False
    for arg in argv:
        if hiding and not _is_flag(arg):
            yield REDACTED, arg
            continue
        hiding = False
        name, eq, value = arg.partition("=")
        if _is_flag(arg) and is_secret_name(name.lstrip("-")):
            if eq:
                yield f"{name}={REDACTED}", value
            else:
                hiding = True  # vLLM's --api-key takes several values
                yield arg, None
        elif eq and _ENV_NAME.fullmatch(name) and is_secret_name(name):
            yield f"{name}={REDACTED}", value  # env HF_TOKEN=... vllm serve
        elif any(c.isspace() for c in arg):
            yield _redact_words(arg), None  # sh -c "vllm serve --api-key X"
        else:
            yield redact_text(arg), None


def _redact_words(command: str) -> str:
    """An argument that is a command line itself (or a header): the text rules over the whole,
    then its words redacted as arguments are (several values after a secret flag)."""
    parts = re.split(r"(\s+)", redact_text(command))
    words = [p for i, p in enumerate(parts) if i % 2 == 0]
    shown = iter(redact_argv(words))
    return "".join(next(shown) if i % 2 == 0 else p for i, p in enumerate(parts))


def redact_argv(argv: Iterable[str]) -> list[str]:
    """A command line with its secrets hidden (see the module docstring)."""
    return [shown for shown, _ in _argv_parts(argv)]


def redact_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment with the values of secret-named variables hidden, sorted by name."""
    return {k: REDACTED if is_secret_name(k) else redact_text(v) for k, v in sorted(env.items())}


def secret_values(argv: Iterable[str] = (), env: Mapping[str, str] | None = None) -> list[str]:
    """The exact values :func:`redact_argv` and :func:`redact_env` hide, for a :class:`Masker`."""
    values = [hidden for _, hidden in _argv_parts(argv) if hidden]
    values += [v for k, v in (env or {}).items() if is_secret_name(k) and v]
    return values


class Masker:
    """Hides known secret values, then anything :func:`redact_text` finds, in output whose
    format is unknown (an engine's log lines)."""

    def __init__(self, values: Sequence[str] = ()) -> None:
        known = sorted({v for v in values if len(v) >= MIN_MASKED_CHARS}, key=len, reverse=True)
        self._known = re.compile("|".join(map(re.escape, known))) if known else None

    def text(self, text: str) -> str:
        if self._known is not None:
            text = self._known.sub(REDACTED, text)
        return redact_text(text)

    def data(self, data: bytes) -> bytes:
        """The same over bytes (what is not UTF-8 passes through unchanged), a run of whole
        lines at a time: one regex pass holds the interpreter, so none may be long (a bundle's
        1 MiB log tail is masked in a thread beside the watch loop)."""
        return b"".join(self._chunk(c) for c in _line_runs(data, MASK_CHUNK_BYTES))

    def _chunk(self, data: bytes) -> bytes:
        return self.text(data.decode("utf-8", "surrogateescape")).encode("utf-8", "surrogateescape")


MASK_CHUNK_BYTES = 32 << 10


def _line_runs(data: bytes, size: int) -> Iterator[bytes]:
    """``data`` in pieces of about ``size`` bytes, each ending at a line end where one is near."""
    start = 0
    while start < len(data):
        end = data.find(b"\n", start + size)
        end = len(data) if end < 0 else end + 1
        yield data[start:end]
        start = end
