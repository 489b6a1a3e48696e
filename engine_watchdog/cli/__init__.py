"""The command line (cli/main.py is the console script's entry point).

Importing the command line takes a moment (click, asyncio; each command's own modules come
later, in main()): a Ctrl-C then would print a KeyboardInterrupt traceback. Until
:func:`engine_watchdog.cli.main.main` runs, SIGINT exits 130 quietly instead, in the console
script only (main puts Python's own handler back).
"""

import os
import signal
import sys
import threading
from types import FrameType


def _quiet_interrupt(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)


_CONSOLE_SCRIPT = os.path.basename(sys.argv[0] if sys.argv else "").startswith("engine-watchdog")
if _CONSOLE_SCRIPT and threading.current_thread() is threading.main_thread():  # not in pytest
    signal.signal(signal.SIGINT, _quiet_interrupt)
