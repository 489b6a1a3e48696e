"""``--pid`` is checked at start: the watchdog acts on what it names, so it must name an engine.

Discovery takes an explicit PID with all its descendants (probes/procs.py), and a restart
SIGKILLs the engine cores among them: a shell that had started two engines got both killed, and
``--pid 1`` (init) covered every process on the host. So each PID must be an engine process
itself (its title or command line is the engine profile's: ``VLLM::EngineCore``, ``vllm
serve``..., or it holds the URL's listening socket) and, where the watchdog may act, belong to
the engine's UID (the watchdog's own, unless ``--engine-uid`` says otherwise). PID 1 passes
where it is the engine (inside the engine's own container). A PID that does not exist is left
to discovery, which reports it gone (the engine is dead), as before. Blocking (psutil reads
/proc).
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Mapping

import psutil

from engine_watchdog.core.settings import SettingsError, WatchSettings
from engine_watchdog.engines import PROFILES
from engine_watchdog.engines.profile import EngineProfile
from engine_watchdog.probes.procs import classify_role, title_of, url_host, url_port
from engine_watchdog.probes.proctable import PsutilTable, RawProc

FIX = "give the PID of the engine's API server, or leave --pid out to find it from the URL's port"
SHOWN_CHARS = 60


def check_pids(settings: WatchSettings, acting: bool = True) -> None:
    """Raise :class:`SettingsError` (one line naming the fix) for a ``--pid`` the watchdog must
    not act on. ``acting`` False (``check``, which only reads processes): any UID will do."""
    pids = settings.probe.pids
    if not pids:
        return
    uid = engine_uid(settings)
    profiles = list(PROFILES.values()) if settings.engine == "auto" else [PROFILES[settings.engine]]
    table = PsutilTable()
    listeners = table.listeners() or {}
    serving: frozenset[int] = frozenset()
    if settings.url:  # the URL's own server, not a socket on its port at another address
        at_url = table.listeners(url_host(settings.url)) or {}
        serving = at_url.get(url_port(settings.url), serving)
    procs: Mapping[int, RawProc] | None = None
    for pid in pids:
        try:
            owner = psutil.Process(pid).uids().real
        except psutil.NoSuchProcess:
            continue
        except psutil.AccessDenied:
            raise SettingsError(f"--pid {pid}: this watchdog may not read that process") from None
        if acting and owner != uid:
            raise SettingsError(
                f"--pid {pid} belongs to UID {owner}, and this watchdog acts only on UID {uid}'s "
                f"processes: pass --engine-uid {owner} if that is the engine's user"
            )
        procs = procs if procs is not None else table.processes()
        raw = procs.get(pid)
        if raw is not None and pid not in serving and not _is_engine(raw, profiles):
            raise SettingsError(_not_an_engine(pid, raw, procs, listeners, profiles))


def engine_uid(settings: WatchSettings) -> int:
    """The UID whose processes the watchdog may act on."""
    uid = settings.recovery.engine_uid
    return os.getuid() if uid is None else uid


def _is_engine(raw: RawProc, profiles: Iterable[EngineProfile]) -> bool:
    title = title_of(raw.cmdline)
    return any(classify_role(title, p) != "other" for p in profiles)


def _not_an_engine(
    pid: int,
    raw: RawProc,
    procs: Mapping[int, RawProc],
    listeners: Mapping[int, frozenset[int]],
    profiles: list[EngineProfile],
) -> str:
    title = title_of(raw.cmdline)[:SHOWN_CHARS] or "?"
    held = _engines_under(pid, procs, {p for ps in listeners.values() for p in ps}, profiles)
    kind = f"a {profiles[0].name}" if len(profiles) == 1 else "an"
    inside = f"; it runs {len(held)} engines (PIDs {', '.join(map(str, held))})" if held else ""
    return f"--pid {pid} ({title}) is not {kind} engine process{inside}: {FIX}"


def _engines_under(
    pid: int, procs: Mapping[int, RawProc], listening: set[int], profiles: list[EngineProfile]
) -> list[int]:
    """The topmost engine processes among ``pid``'s descendants (servers, or engine-titled)."""
    children: dict[int, list[int]] = {}
    for p in procs.values():
        children.setdefault(p.ppid, []).append(p.pid)
    found: list[int] = []
    stack, seen = list(children.get(pid, ())), {pid}
    while stack and len(found) < 16:
        child = stack.pop()
        raw = procs.get(child)
        if raw is None or child in seen:
            continue
        seen.add(child)
        if child in listening or _is_engine(raw, profiles):
            found.append(child)  # its own descendants are that engine's
        else:
            stack.extend(children.get(child, ()))
    return sorted(found)
