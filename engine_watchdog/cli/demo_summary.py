"""The demo's story: its lines as they happen, and the summary it ends with, which says what
the demo saw and wrote in words (no Python repr, only the bundle's entries that are there)."""

from __future__ import annotations

import asyncio
import re
import time
from dataclasses import dataclass, field
from pathlib import Path

import click

from engine_watchdog.core.model import Verdict
from engine_watchdog.sim.loadgen import LoadOutcome


@dataclass
class Story:
    """What the demo saw, with monotonic times relative to its start."""

    start: float = field(default_factory=time.monotonic)
    marks: dict[str, float] = field(default_factory=dict)
    stall: Verdict | None = None
    recovered: asyncio.Event = field(default_factory=asyncio.Event)
    progress_seen: asyncio.Event = field(default_factory=asyncio.Event)
    """The watchdog has seen the engine make progress (so a hang has a last progress)."""
    bundles_before: set[Path] = field(default_factory=set)
    """The --incident-dir's bundles of earlier runs: the summary names only this run's."""

    def now(self) -> float:
        return time.monotonic() - self.start

    quiet: bool = False
    """Interrupted: nothing more is told (the watchdog and the clients still stop behind)."""

    def say(self, text: str) -> None:
        if not self.quiet:
            click.echo(f"[{self.now():6.1f}s] {text}")

    def interrupted(self) -> None:
        self.say(
            "interrupted: stopping the clients, the watchdog and the simulated engine "
            "(a second Ctrl-C ends it at once)"
        )
        self.quiet = True

    def mark(self, name: str, text: str) -> None:
        self.marks.setdefault(name, self.now())
        self.say(text)


def report(story: Story, outcome: LoadOutcome, incident_dir: Path, ok: bool) -> int:
    m = story.marks
    click.echo("\n== summary ==")
    if story.stall is not None and "fault" in m and "stalled" in m:
        v = story.stall
        since = v.last_progress_t
        latency = f"{v.t - since:.1f} s after the last progress" if since else "n/a"
        after_fault = m["stalled"] - m["fault"]
        click.echo(f"stall verdict: {v.cause}, {latency} ({after_fault:.1f} s after the fault)")
    if "restart" in m and "back" in m:
        click.echo(f"engine back: {m['back'] - m['restart']:.1f} s after the restart")
    for bundle in (b for b in bundles(incident_dir) if b not in story.bundles_before):
        click.echo(f"incident bundle: {bundle}")
        click.echo(f"  holds {bundle_contents(bundle)}")
    if "stuck-answered" in m:
        click.echo(
            f"stuck request: answered {m['stuck-answered'] - m['stuck']:.1f} s after the fault"
        )
    click.echo(f"clients: {clients_text(outcome)}")
    passed = ok and outcome.hanging == 0 and story.stall is not None and "stuck-answered" in m
    click.echo("demo: OK" if passed else "demo: FAILED")
    return 0 if passed else 1


def bundles(incident_dir: Path) -> list[Path]:
    """The bundles the demo wrote, oldest first (the capture before the abort, and the one
    before the restart when it found something to dump)."""
    if not incident_dir.is_dir():
        return []
    found = [p for p in incident_dir.iterdir() if not p.name.startswith(".")]
    return sorted(p for p in found if p.is_dir() or p.name.endswith(".tar.gz"))


def bundle_contents(bundle: Path) -> str:
    """What is in the bundle, as it was written: ``summary.md (start here), pyspy/ (2 files)``."""
    if not bundle.is_dir():
        return "the bundle as one .tar.gz (--tar)"
    parts = []
    for entry in sorted(bundle.iterdir(), key=lambda p: (p.name != "summary.md", p.name)):
        if entry.is_dir():
            count = sum(1 for _ in entry.iterdir())
            parts.append(f"{entry.name}/ ({count} file{'s' if count != 1 else ''})")
        else:
            parts.append(entry.name + (" (start here)" if entry.name == "summary.md" else ""))
    return ", ".join(parts)


ERROR_MESSAGE = re.compile(r'"message":\s*"((?:[^"\\]|\\.)*)')


def clients_text(outcome: LoadOutcome) -> str:
    """``20 streaming requests: 19 completed, 1 ended with an error (...), none left hanging``."""
    text = f"{outcome.started} streaming requests: {outcome.completed} completed"
    if outcome.errored:
        first = outcome.errors[0] if outcome.errors else ""
        said = ERROR_MESSAGE.search(first)
        why = f' ("{said.group(1)}")' if said else (f" ({first})" if first else "")
        text += f", {outcome.errored} ended with an error{why}"
    hanging = "none" if outcome.hanging == 0 else str(outcome.hanging)
    return f"{text}, {hanging} left hanging; {outcome.chunks} chunks streamed"
