"""The command line (cli/main.py is the console script's entry point).

Importing the command line takes a moment (click, asyncio; each command's own modules come
later, in main()): a Ctrl-C then would print a KeyboardInterrupt traceback. Until
:func:`engine_watchdog.cli.main.main` runs, SIGINT exits 130 quietly instead, in the console
script only (main puts Python's own handler back). The handler goes in before anything else is
imported, through ``_signal`` (the C module ``signal`` wraps): ``import signal`` and
``threading`` alone take about 3 ms here, and a Ctrl-C landing in them printed a traceback
(tests/integration/test_stopping.py, under load).
"""

import _signal  # type: ignore[import-not-found]  # (no stub: the C module behind signal)
import os
import sys
from types import FrameType


def _quiet_interrupt(signum: int, frame: FrameType | None) -> None:
    sys.exit(128 + signum)


_CONSOLE_SCRIPT = os.path.basename(sys.argv[0] if sys.argv else "").startswith("engine-watchdog")
if _CONSOLE_SCRIPT:
    try:  # noqa: SIM105 (contextlib is one more import before the handler)
        _signal.signal(_signal.SIGINT, _quiet_interrupt)
    except ValueError:  # not the main thread (not the console script's start): nothing to do
        pass
