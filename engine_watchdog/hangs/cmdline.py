"""Flags on an engine's command line, as the bundle holds it (processes.json, secrets already
redacted). ``--foo-bar`` and ``--foo_bar`` are one flag; ``--flag=value`` and ``--flag value``
are both understood, so are vLLM's dotted forms (``--speculative_config.method mtp``)."""

from __future__ import annotations

from collections.abc import Sequence


def norm(flag: str) -> str:
    """``--speculative_config.method`` -> ``--speculative-config.method``."""
    dashes = len(flag) - len(flag.lstrip("-"))
    return flag[:dashes] + flag[dashes:].replace("_", "-")


def _is_flag(arg: str) -> bool:
    if not arg.startswith("-") or arg == "-" or arg == "--":
        return False
    try:
        float(arg)
    except ValueError:
        return True
    return False  # a negative number is a value


def flags(argv: Sequence[str]) -> list[tuple[str, str]]:
    """(normalized flag, value) pairs in order; the value is ``""`` for a flag followed by
    another flag or by nothing (a boolean flag followed by a positional argument reports that
    argument as its value, which no boolean check reads)."""
    out = []
    for i, arg in enumerate(argv):
        if not _is_flag(arg):
            continue
        name, eq, value = arg.partition("=")
        if not eq and i + 1 < len(argv) and not _is_flag(argv[i + 1]):
            value = argv[i + 1]
        out.append((norm(name), value))
    return out


def flag_check(
    argv: Sequence[str], names: Sequence[str], value_contains: str, min_value: float | None
) -> str | None:
    """The matching ``flag value`` text, or None. With no condition, presence is enough."""
    wanted = {norm(n) for n in names}
    for name, value in flags(argv):
        if name not in wanted:
            continue
        if value_contains and value_contains.lower() not in value.lower():
            continue
        if min_value is not None and not _at_least(value, min_value):
            continue
        return f"{name} {value}".strip()[:200]
    return None


def _at_least(value: str, low: float) -> bool:
    try:
        return float(value) >= low
    except ValueError:
        return False


def contains_any(argv: Sequence[str], words: Sequence[str]) -> str | None:
    """The first argument containing one of ``words`` (case-insensitive), or None."""
    for arg in argv:
        low = arg.lower()
        if any(w.lower() in low for w in words):
            return arg[:200]
    return None
