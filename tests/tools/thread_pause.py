"""Pause ONE thread of another process, as a debugger's breakpoint would, and let the others run.

``SIGSTOP`` stops every thread of a process (POSIX has no per-thread stop), and gdb attached in
non-stop batch mode stopped them all and left the process stopped after it detached (tried on
llama-server, gdb 13.1). ptrace does it per thread: ``PTRACE_SEIZE`` attaches to one TID
without stopping anything, ``PTRACE_INTERRUPT`` stops that thread alone, ``PTRACE_DETACH``
lets it go on. Linux only; the caller needs ptrace rights over the target (same UID under
Yama scope 0 or 1 as the target's ancestor, or root).

    python tests/tools/thread_pause.py PID TID SECONDS
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
import time

PTRACE_DETACH = 17
PTRACE_SEIZE = 0x4206
PTRACE_INTERRUPT = 0x4207
WALL = 0x40000000  # __WALL: wait for any thread

_libc = ctypes.CDLL(None, use_errno=True)
_libc.ptrace.argtypes = [ctypes.c_long, ctypes.c_long, ctypes.c_void_p, ctypes.c_void_p]
_libc.ptrace.restype = ctypes.c_long


def _ptrace(request: int, tid: int) -> None:
    if _libc.ptrace(request, tid, None, None) == -1:
        err = ctypes.get_errno()
        raise OSError(err, f"ptrace({request:#x}, {tid}): {os.strerror(err)}")


def pause_thread(tid: int, seconds: float) -> None:
    """Stop thread ``tid`` for ``seconds``; it runs on after (also on an exception). Says
    ``paused`` on stdout once the thread is stopped."""
    _ptrace(PTRACE_SEIZE, tid)
    try:
        _ptrace(PTRACE_INTERRUPT, tid)
        os.waitpid(tid, WALL)
        print("paused", flush=True)
        time.sleep(seconds)
    finally:
        _ptrace(PTRACE_DETACH, tid)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        print(f"usage: {argv[0]} PID TID SECONDS", file=sys.stderr)
        return 2
    # SIGTERM ends the pause early: as SystemExit, so the detach in pause_thread's finally runs.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    pid, tid, seconds = int(argv[1]), int(argv[2]), float(argv[3])
    if not os.path.exists(f"/proc/{pid}/task/{tid}"):
        print(f"no thread {tid} in process {pid}", file=sys.stderr)
        return 1
    pause_thread(tid, seconds)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
