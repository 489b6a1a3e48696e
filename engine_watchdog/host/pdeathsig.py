"""Children that die with the watchdog: ``PR_SET_PDEATHSIG``, set in the child before it execs.

A watchdog killed with SIGKILL (the OOM killer, ``kill -9``) runs no cleanup, so what it started
would run on unsupervised: a py-spy attached to the engine, or in supervise mode the engine
itself. Linux ties a child's life to its parent's with ``prctl(PR_SET_PDEATHSIG, sig)``: the
kernel sends ``sig`` to the child when the thread that forked it ends (here the event loop's,
which lives as long as the process). It must be set in the child between fork and exec, and
subprocess's ``preexec_fn`` may deadlock in a process that has threads (the watchdog has), so a
tiny wrapper does it: this file, run as a script by the same Python in isolated mode (``-I
-S``: no site, nothing from the environment; a few milliseconds), sets the signal, checks that
its parent has not died already (the race prctl leaves open), and execs the real command, which
keeps the PID and the setting. Used by capture's tools and by supervise mode; off Linux,
commands run unwrapped.
"""

from __future__ import annotations

import ctypes
import os
import sys
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1
EXIT_NOT_FOUND = 127
EXIT_PARENT_GONE = 1


def wrap(argv: Sequence[str], signum: int) -> list[str]:
    """``argv`` as a command that gets ``signum`` when this process ends."""
    if not sys.platform.startswith("linux"):
        return list(argv)
    here = os.path.abspath(__file__)
    return [sys.executable, "-I", "-S", here, str(int(signum)), str(os.getpid()), "--", *argv]


def main(args: Sequence[str]) -> int:
    """``SIGNUM PARENT_PID -- PROGRAM ARGS...``: set the signal, then become PROGRAM."""
    signum, parent, argv = int(args[0]), int(args[1]), list(args[3:])
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signum, 0, 0, 0)
    except (OSError, AttributeError):  # no prctl: the command runs without the guard
        pass
    if os.getppid() != parent:
        return EXIT_PARENT_GONE  # the watchdog died before the guard was set: do not start
    try:
        os.execvp(argv[0], argv)
    except OSError as exc:
        sys.stderr.write(f"engine-watchdog: cannot run {argv[0]}: {exc.strerror or exc}\n")
    return EXIT_NOT_FOUND


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
