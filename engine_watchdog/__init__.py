"""engine-watchdog: catches LLM serving engines that hang silently.

Importing the command line takes a moment (click, asyncio; each command's own modules come
later, in main()): a Ctrl-C then would print a KeyboardInterrupt traceback and exit 1, which a
``check`` caller reads as "stalled". Until :func:`engine_watchdog.cli.main.main` runs, SIGINT
ends the process quietly instead, by SIGINT itself as at any other moment
(runtime/stopping.py: a shell shows 130), in the console script only (main puts Python's own
handler back). The handler goes in here, the first code of ours the console script runs,
before anything else is imported, through ``_signal`` (the C module ``signal`` wraps):
``import signal`` and ``threading`` alone take about 3 ms here, and a Ctrl-C landing in them
printed a traceback (tests/integration/test_stopping.py, under load). It ends the process at
once: an exit through the interpreter's shutdown met a second Ctrl-C there, and printed a
traceback. What comes before this line is the interpreter's own start (docs/reliability.md).
"""

import _signal  # type: ignore[import-not-found]  # (no stub: the C module behind signal)
import os
import sys

__version__ = "0.1.0"


def _quiet_interrupt(signum: int, frame: object) -> None:
    _signal.signal(signum, _signal.SIG_DFL)
    _signal.raise_signal(signum)
    os._exit(128 + signum)  # (PID 1 in a container ignores its own default action)


if os.path.basename(sys.argv[0] if sys.argv else "").startswith("engine-watchdog"):
    try:  # noqa: SIM105 (contextlib is one more import before the handler)
        _signal.signal(_signal.SIGINT, _quiet_interrupt)
    except ValueError:  # not the main thread (not the console script's start): nothing to do
        pass
