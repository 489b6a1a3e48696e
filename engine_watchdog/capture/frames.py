"""Where is a thread stuck? A small table of known frames applied to py-spy's JSON stacks.

A thread's verdict comes from its innermost *known* frame (lock acquire, CUDA synchronize, NCCL,
zmq, select/epoll, sleep...), the innermost Python function outside that frame, and the nearest
engine context around it (engine step, execute_model). Identical stacks in one process are
grouped ("3 threads"). No cleverness: an unknown frame is reported as what it is.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

# (kind, phrase, native-frame name fragments)
_NATIVE: tuple[tuple[str, str, tuple[str, ...]], ...] = (
    (
        "cuda-sync",
        "waiting in {f}",
        (
            "cuCtxSynchronize",
            "cudaDeviceSynchronize",
            "cuStreamSynchronize",
            "cudaStreamSynchronize",
            "cuEventSynchronize",
            "cudaEventSynchronize",
        ),
    ),
    ("collective", "in a collective ({f})", ("nccl", "Nccl", "NCCL", "c10d::")),
    ("gil", "waiting for the GIL", ("take_gil",)),
    (
        "lock",
        "blocked acquiring a lock",
        (
            "PyThread_acquire_lock",
            "pthread_mutex_lock",
            "__lll_lock_wait",
            "sem_wait",
            "sem_clockwait",
            "sem_timedwait",
        ),
    ),
    (
        "condition",
        "waiting on a condition",
        ("pthread_cond_wait", "pthread_cond_timedwait", "pthread_cond_clockwait"),
    ),
    ("join", "waiting for a thread to finish", ("pthread_join",)),
    ("zmq", "waiting for a message (zmq {f})", ("zmq_poll", "zmq_msg_recv", "zmq_recv", "zmq::")),
    (
        "io-wait",
        "waiting for I/O ({f})",
        (
            "epoll_wait",
            "select_epoll",
            "select_select",
            "select_poll",
            "__poll",
            "__select",
            "ppoll",
        ),
    ),
    ("sleep", "sleeping", ("clock_nanosleep", "nanosleep", "time_sleep", "pysleep")),
    ("read", "blocked reading ({f})", ("__libc_read", "__libc_recv", "sock_recv", "_io__Buffered")),
)

# (kind, phrase, Python function names, file fragment the frame's file must contain)
_PYTHON: tuple[tuple[str, str, tuple[str, ...], str], ...] = (
    ("cuda-sync", "waiting in torch.cuda.{f}", ("synchronize",), "cuda"),
    (
        "collective",
        "in a collective ({f})",
        (
            "all_reduce",
            "all_gather",
            "all_gather_into_tensor",
            "reduce_scatter",
            "reduce_scatter_tensor",
            "broadcast",
            "barrier",
            "all_to_all",
        ),
        "distributed",
    ),
    ("lock", "blocked acquiring a lock", ("acquire", "__enter__"), "threading"),
    ("condition", "waiting on a condition", ("wait", "wait_for"), "threading"),
    ("join", "waiting for a thread to finish", ("join", "_wait_for_tstate_lock"), "threading"),
    ("queue", "waiting on a queue", ("get",), "queue"),
    (
        "zmq",
        "waiting for a message (zmq {f})",
        ("recv", "recv_multipart", "recv_pyobj", "poll"),
        "zmq",
    ),
    ("io-wait", "waiting for I/O ({f})", ("select", "poll", "_run_once"), ""),
)

# The source line of a Python-only stack (no --native, e.g. a stopped process) still tells.
_SOURCE: tuple[tuple[str, str, re.Pattern[str]], ...] = (
    ("lock", "blocked acquiring a lock", re.compile(r"\.acquire\(|^with .*lock\b", re.I)),
    ("cuda-sync", "waiting in a CUDA synchronize", re.compile(r"synchronize\(")),
    ("collective", "in a collective", re.compile(r"all_reduce|all_gather|barrier\(")),
    ("condition", "waiting on a condition", re.compile(r"\.wait\(")),
    ("sleep", "sleeping", re.compile(r"\bsleep\(")),
    ("queue", "waiting on a queue", re.compile(r"\.get\(")),
)

# Engine context around the stuck frame (vLLM names), nearest wins.
CONTEXTS: dict[str, str] = {
    "execute_model": "execute_model",
    "sample_tokens": "sampling",
    "step": "engine step",
    "step_with_batch_queue": "engine step",
    "_process_engine_step": "engine step",
    "run_busy_loop": "the engine busy loop",
    "collective_rpc": "collective_rpc",
}

# The same for a native-only stack (llama.cpp's llama-server, read by eu-stack): a fragment of
# the C++ function's unqualified name, nearest wins.
NATIVE_CONTEXTS: dict[str, str] = {
    "llama_decode": "llama_decode",
    "llama_process": "llama_process (decode)",
    "graph_compute": "graph compute",
    "update_slots": "the slot update",
    "start_loop": "the task loop",
}
_SYSTEM_LIBS = ("libc.so", "libc-", "libstdc++", "libgomp", "libpthread", "ld-linux", "libgcc_s")
"""Modules whose frames say how a native thread waits, not whose code waits."""


@dataclass(frozen=True)
class Frame:
    name: str
    file: str
    line: int
    native: bool = False
    """A C/C++ frame (``--native``): py-spy names its module (the .so); Python frames have none.
    Native frames may carry a line too (``sock_call_ex (socketmodule.c:921)``)."""

    @property
    def func(self) -> str:
        return self.name.rsplit(".", 1)[-1]

    def text(self) -> str:
        where = self.file.rsplit("/", 1)[-1]
        return f"{self.name} ({where}:{self.line})" if self.line else f"{self.name} ({where})"


@dataclass(frozen=True)
class ThreadStack:
    pid: int
    tid: int
    name: str
    active: bool
    frames: tuple[Frame, ...]
    """Innermost first, as py-spy lists them."""


@dataclass(frozen=True)
class Diagnosis:
    kind: str
    """cuda-sync | collective | gil | lock | condition | join | zmq | io-wait | sleep | read |
    queue | running | idle"""
    activity: str
    """e.g. "blocked acquiring a lock in _step_with_lock under engine step"."""
    frame: str
    """The frame the verdict rests on, as text."""


@dataclass(frozen=True)
class ThreadGroup:
    """Threads of one process with identical stacks."""

    threads: tuple[ThreadStack, ...]
    diagnosis: Diagnosis

    @property
    def count(self) -> int:
        return len(self.threads)


def parse_threads(data: Any, pid: int) -> list[ThreadStack]:
    """py-spy ``dump --json`` output -> ThreadStacks (unknown shapes are skipped)."""
    out: list[ThreadStack] = []
    for th in data if isinstance(data, list) else []:
        if not isinstance(th, dict):
            continue
        frames = tuple(_frame(f) for f in th.get("frames") or [] if isinstance(f, dict))
        tid = int(th.get("os_thread_id") or th.get("thread_id") or 0)
        name = str(th.get("thread_name") or "")
        out.append(ThreadStack(pid, tid, name, bool(th.get("active")), frames))
    return out


def _frame(f: dict[str, Any]) -> Frame:
    line = int(f.get("line") or 0)
    native = f.get("module") is not None or line == 0
    return Frame(str(f.get("name") or "?"), str(f.get("filename") or ""), line, native)


def _match_native(fr: Frame) -> tuple[str, str] | None:
    for kind, phrase, names in _NATIVE:
        if any(n in fr.name for n in names):
            return kind, phrase.format(f=fr.name)
    return None


def _match_python(fr: Frame) -> tuple[str, str] | None:
    for kind, phrase, funcs, file_part in _PYTHON:
        if fr.func in funcs and file_part in fr.file:
            return kind, phrase.format(f=fr.func)
    return None


SourceLine = Callable[[int, str, int], "str | None"]
"""(pid, filename, line) -> that source line, or None."""


def diagnose(th: ThreadStack, source_line: SourceLine | None = None) -> Diagnosis:
    """The innermost known frame, the Python function around it and its engine context."""
    for i, fr in enumerate(th.frames):
        hit = _match_native(fr) if fr.native else _match_python(fr)
        if hit:
            # The Python function that called into the known frame, not the frame itself.
            outer = i + 1 if not fr.native else i
            return Diagnosis(hit[0], hit[1] + _around(th.frames, outer), fr.text())
    py = next((j for j, f in enumerate(th.frames) if not f.native), None)
    if py is not None and source_line and not any(f.native for f in th.frames):
        fr = th.frames[py]
        src = (source_line(th.pid, fr.file, fr.line) or "").strip()
        for kind, phrase, pattern in _SOURCE:
            if pattern.search(src):
                return Diagnosis(kind, f"{phrase}{_around(th.frames, py)} (`{src}`)", fr.text())
    kind = "running" if th.active else "idle"
    top = th.frames[py].text() if py is not None else (th.frames[0].text() if th.frames else "?")
    return Diagnosis(kind, kind + _around(th.frames, py or 0), top)


def _around(frames: Sequence[Frame], start: int) -> str:
    """' in <innermost Python function from start> under <nearest engine context>'; for a
    stack with no Python frame at all, the innermost native function outside the C and C++
    runtimes and its nearest native context."""
    py = next((j for j in range(start, len(frames)) if not frames[j].native), None)
    if py is None:
        return _native_around(frames, start) if all(f.native for f in frames) else ""
    text = f" in {frames[py].func}"
    for fr in frames[py + 1 :]:
        if not fr.native and fr.func in CONTEXTS and fr.func != frames[py].func:
            return f"{text} under {CONTEXTS[fr.func]}"
    return text


def native_func(name: str) -> str:
    """``ns::cls::method(args) const`` -> ``method``; a C name stays as it is."""
    return name.split("(", 1)[0].rsplit("::", 1)[-1]


def _native_around(frames: Sequence[Frame], start: int) -> str:
    own = next(
        (
            j
            for j in range(start, len(frames))
            if not frames[j].file.rsplit("/", 1)[-1].startswith(_SYSTEM_LIBS)
            and not frames[j].name.startswith("0x")
        ),
        None,
    )
    if own is None:
        return ""
    text = f" in {native_func(frames[own].name)}"
    for fr in frames[own:]:
        func = native_func(fr.name)
        hit = next((ctx for key, ctx in NATIVE_CONTEXTS.items() if key in func), None)
        if hit is not None and func != native_func(frames[own].name):
            return f"{text} under {hit}"
    return text


def group_threads(
    threads: Sequence[ThreadStack], source_line: SourceLine | None = None
) -> list[ThreadGroup]:
    """Group identical stacks (first seen first; the main thread's group leads)."""
    groups: dict[tuple[Frame, ...], list[ThreadStack]] = {}
    for th in sorted(threads, key=lambda t: (t.tid != t.pid, t.tid)):
        groups.setdefault(th.frames, []).append(th)
    return [ThreadGroup(tuple(ths), diagnose(ths[0], source_line)) for ths in groups.values()]


def thread_label(group: ThreadGroup) -> str:
    """'main thread', 'thread "name"' or '3 threads ("a", "b", ...)'."""
    first = group.threads[0]
    if group.count == 1:
        if first.tid == first.pid or first.name == "MainThread":
            return "main thread"
        return f'thread "{first.name}"' if first.name else f"thread {first.tid}"
    names = sorted({t.name or str(t.tid) for t in group.threads})
    shown = ", ".join(f'"{n}"' for n in names[:3]) + (", ..." if len(names) > 3 else "")
    return f"{group.count} threads ({shown})"
