"""The options of what is watched and how it is judged: --engine, the probes (PROBE) and the
stall detector (DETECTOR)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import click

from engine_watchdog.cli.numbers import POSITIVE, SECONDS
from engine_watchdog.cli.option_group import One, Opt, OptionGroup
from engine_watchdog.core.settings import DetectorSettings, ProbeSettings
from engine_watchdog.net.access import tls_context


def _pids(values: Sequence[int]) -> tuple[int, ...]:
    return tuple(values)


def _ca_file(path: Path) -> Path:
    tls_context(path)  # a file that cannot be loaded is a usage error now, not a probe error later
    return path


def _engine_names() -> list[str]:
    from engine_watchdog.engines import PROFILES

    return ["auto", *sorted(PROFILES)]


ENGINE = One(
    Opt(
        "--engine",
        "engine",
        "Engine profile; auto: from the first /metrics answer's series.",
        click.Choice(_engine_names()),
    ),
    default="auto",
)


PROBE = OptionGroup(
    ProbeSettings,
    Opt("--interval", "interval_s", "Seconds between probe rounds.", POSITIVE),
    Opt(
        "--scrape-timeout",
        "scrape_timeout_s",
        "Timeout of one /metrics or /health request.",
        POSITIVE,
    ),
    Opt("--canary/--no-canary", "canary", "Send a 1-token request when in doubt."),
    Opt("--canary-timeout", "canary_timeout_s", "A canary slower than this has failed.", POSITIVE),
    Opt("--gpu/--no-gpu", "gpu", "Sample GPUs through NVML."),
    Opt(
        "--pid",
        "pids",
        "Engine process (repeatable); default: found from the URL's port.",
        int,
        multiple=True,
        convert=_pids,
    ),
    Opt(
        "--max-scrape-bytes",
        "max_scrape_bytes",
        "A /metrics body larger than this is an error (the read stops there).",
        int,
    ),
    Opt(
        "--ca-file",
        "ca_file",
        "PEM file of the CA(s) to trust for an https engine (default: the system's).",
        click.Path(dir_okay=False, path_type=Path),
        convert=_ca_file,
    ),
    Opt(
        "--api-key-file",
        "api_key_file",
        "File holding the engine's API key (vLLM --api-key) for the canary and the abort; "
        "else ENGINE_WATCHDOG_API_KEY, else VLLM_API_KEY. Never give the key as an argument.",
        click.Path(dir_okay=False, path_type=Path),
    ),
)
DETECTOR = OptionGroup(
    DetectorSettings,
    Opt(
        "--stall-seconds",
        "stall_seconds",
        "No progress this long with work present: stalled.",
        POSITIVE,
    ),
    Opt(
        "--suspect-seconds",
        "suspect_seconds",
        "No progress this long with work present: suspect.",
        SECONDS,
    ),
    Opt(
        "--startup-grace",
        "startup_grace_seconds",
        "No stall verdict this long after the first scrape.",
        SECONDS,
    ),
    Opt(
        "--fast-stall-seconds",
        "fast_stall_seconds",
        "Stalled this soon with strong evidence (stopped process, GPU spin, canary).",
        SECONDS,
    ),
    Opt(
        "--canary-after",
        "canary_after_seconds",
        "Send a canary once progress has been flat this long with work present.",
        SECONDS,
    ),
    Opt(
        "--idle-canary-interval",
        "idle_canary_seconds",
        "Send a canary this often while the engine looks idle.",
        POSITIVE,
    ),
    Opt(
        "--stalled-canary-interval",
        "stalled_canary_seconds",
        "Send a canary this often while stalled, or idle after a failed canary (the way out).",
        float,
    ),
    Opt(
        "--wire-stall-seconds",
        "wire_stall_seconds",
        "With the guard: no event on the wire this long, streams open, the engine idle or "
        "stopped: stalled.",
        POSITIVE,
    ),
    Opt(
        "--request-stall-seconds",
        "request_stall_seconds",
        "With the guard: one stream silent this long (at least) while the others move: stuck.",
        POSITIVE,
    ),
)
