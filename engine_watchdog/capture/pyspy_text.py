"""py-spy's ``dump`` text, read back into the frames of capture/frames.py.

The capture step keeps py-spy's JSON (frames.py reads it); this reads the text layout, which
is what a person pastes, what ``py-spy dump`` without ``--json`` prints on another node, and
what the multi-node fixtures hold (tests/data/multinode/README.md)::

    Process 7564: python gloo_ranks.py 0 3 29511 skip
    Python v3.11.7 (/usr/bin/python3.11)

    Thread 7564 (idle): "MainThread"
        all_reduce (torch/distributed/distributed_c10d.py:3252)
        c10d::Work::wait (libtorch_cpu.so)

``--locals`` lines (indented deeper) and py-spy's error text are skipped. A rank's stack for
:class:`engine_watchdog.core.ranks.RankSample` is :func:`rank_stack`.
"""

from __future__ import annotations

import re

from engine_watchdog.capture.frames import Frame, ThreadStack
from engine_watchdog.core.collective_frames import is_python, split_frame

_PROCESS = re.compile(r"^Process (\d+):")
_THREAD = re.compile(r'^Thread (0x[0-9a-fA-F]+|\d+) \(([a-z+]+)\)(?:: "(.*)")?\s*$')
_FRAME_INDENT = "    "


def parse_frame(line: str) -> Frame:
    """``name (file:line)`` or ``symbol (module)`` (core/collective_frames.py splits it)."""
    name, file, number = split_frame(line.strip())
    return Frame(name, file, number, native=not is_python(file))


def parse_dump_text(text: str) -> list[ThreadStack]:
    """Every thread of a ``py-spy dump`` text, innermost frame first; [] for py-spy's errors."""
    pid = 0
    out: list[ThreadStack] = []
    head: tuple[int, str, bool] | None = None
    frames: list[Frame] = []
    for line in text.splitlines():
        if m := _PROCESS.match(line):
            pid = int(m.group(1))
        elif m := _THREAD.match(line):
            if head is not None:
                out.append(ThreadStack(pid, head[0], head[1], head[2], tuple(frames)))
            tid = int(m.group(1), 16) if m.group(1).startswith("0x") else int(m.group(1))
            head, frames = (tid, m.group(3) or "", m.group(2) != "idle"), []
        elif head is not None and line.startswith(_FRAME_INDENT) and line[4:5] != " ":
            frames.append(parse_frame(line))
        elif head is not None and line.strip() and not line.startswith(_FRAME_INDENT):
            out.append(ThreadStack(pid, head[0], head[1], head[2], tuple(frames)))
            head, frames = None, []
    if head is not None:
        out.append(ThreadStack(pid, head[0], head[1], head[2], tuple(frames)))
    return out


def frame_text(frame: Frame) -> str:
    """A frame as RankSample holds it: ``name (file:line)``, the file as py-spy named it."""
    return (
        f"{frame.name} ({frame.file}:{frame.line})"
        if frame.line
        else f"{frame.name} ({frame.file})"
    )


def rank_stack(text: str) -> tuple[str, ...]:
    """The main thread's frames of one dump (the first thread when none is the main one)."""
    threads = parse_dump_text(text)
    main = next((t for t in threads if t.tid == t.pid or t.name == "MainThread"), None)
    chosen = main or (threads[0] if threads else None)
    return tuple(frame_text(f) for f in chosen.frames) if chosen else ()
