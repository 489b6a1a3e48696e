"""Is a rank waiting in a collective? Read from its innermost frames (pure).

A frame is text as :class:`engine_watchdog.core.ranks.RankSample` holds it, ``function
(file:line)`` for Python frames and ``symbol (module)`` for native ones, innermost first, the
way ``py-spy dump`` prints them. The collectives named here are the waits every rank of a group
sits in when one of them stopped: torch.distributed's collectives (gloo and NCCL alike:
``torch/distributed/distributed_c10d.py``), vLLM's own (``vllm/distributed/...``), the native
waits under them (``c10d::Work::wait``, ``gloo::``, ``nccl``), and vLLM's shared-memory
broadcast of the scheduler's output to the workers
(``vllm/distributed/device_communicators/shm_broadcast.py``: ``dequeue`` / ``acquire_read`` for
the readers, ``enqueue`` / ``acquire_write`` for the writer that waits for them).
"""

from __future__ import annotations

from collections.abc import Sequence

COLLECTIVE_FUNCS = frozenset(
    {
        "all_reduce",
        "all_gather",
        "all_gather_into_tensor",
        "all_gather_object",
        "reduce_scatter",
        "reduce_scatter_tensor",
        "broadcast",
        "broadcast_object_list",
        "barrier",
        "monitored_barrier",
        "all_to_all",
        "all_to_all_single",
        "gather",
        "scatter",
        "reduce",
        "send",
        "recv",
        "wait",
    }
)
"""Python functions that wait in a collective when their file is under a ``distributed``
folder (torch.distributed, vllm.distributed)."""
SHM_BROADCAST_FUNCS = frozenset({"dequeue", "acquire_read", "enqueue", "acquire_write"})
NATIVE_COLLECTIVE = ("c10d::", "gloo::", "nccl", "Nccl", "NCCL")
PYTHON_FRAMES_LOOKED_AT = 3
"""How many innermost Python frames may hold the collective: a wait is often wrapped
(torch's ``_exception_logger`` wrapper, a contextmanager's ``__enter__`` around
``acquire_read``)."""
WAIT_HELPERS = ("threading.py", "queue.py", "selectors.py", "socket.py", "contextlib.py")
"""Standard-library files a wait passes through (``Event.wait`` -> ``Condition.wait``): their
frames are not counted among the innermost few."""


def split_frame(frame: str) -> tuple[str, str, int]:
    """``"all_reduce (torch/distributed/distributed_c10d.py:3252)"`` -> (function, file, line);
    a native frame has line 0 and its module as file. Names may hold parentheses (C++): the
    location is the last ``" ("``."""
    name, sep, rest = frame.rpartition(" (")
    if not sep or not rest.endswith(")"):
        return frame, "", 0
    where = rest[:-1]
    file, colon, line = where.rpartition(":")
    if colon and line.isdigit():
        return name, file, int(line)
    return name, where, 0


def is_python(file: str) -> bool:
    return file.endswith(".py")


def collective_of(frame: str) -> str | None:
    """The collective this one frame waits in (``all_reduce``, ``shm_broadcast dequeue``,
    ``c10d::Work::wait``), or None."""
    name, file, _ = split_frame(frame)
    func = name.rsplit(".", 1)[-1]
    if is_python(file):
        if "shm_broadcast" in file and func in SHM_BROADCAST_FUNCS:
            return f"shm_broadcast {func}"
        if "distributed" in file and func in COLLECTIVE_FUNCS:
            return func
        return None
    return name if any(n in name for n in NATIVE_COLLECTIVE) else None


def collective_wait(stack: Sequence[str]) -> str | None:
    """The collective a stack waits in: the outermost known one among the native frames and
    the innermost few Python frames (the Python name is the one a person knows:
    ``all_reduce`` rather than ``c10d::Work::wait``); None when the stack is elsewhere."""
    found: str | None = None
    python_seen = 0
    for frame in stack:
        hit = collective_of(frame)
        if hit is not None:
            found = hit
        file = split_frame(frame)[1]
        if is_python(file) and not file.endswith(WAIT_HELPERS):
            python_seen += 1
            if python_seen >= PYTHON_FRAMES_LOOKED_AT:
                break
    return found


def innermost_python(stack: Sequence[str]) -> str | None:
    """The innermost Python frame, or the innermost frame of a native-only stack."""
    for frame in stack:
        if is_python(split_frame(frame)[1]):
            return frame
    return stack[0] if stack else None
