"""Which event loop the process runs (engine_watchdog/runtime/loop.py): uvloop while the guard
runs, unless told otherwise or not installed; asyncio's without a guard."""

from __future__ import annotations

import asyncio
import importlib.util
import signal
import subprocess
import sys

import pytest

from engine_watchdog.core.checks import validate_process
from engine_watchdog.core.settings import ProcessSettings, SettingsError
from engine_watchdog.runtime.loop import loop_of, run

GUARD = "127.0.0.1:8001"


@pytest.mark.parametrize(
    ("listen", "asked", "runs"),
    [
        (None, "auto", "asyncio"),
        (None, "uvloop", "asyncio"),
        (GUARD, "auto", "uvloop"),
        (GUARD, "uvloop", "uvloop"),
        (GUARD, "asyncio", "asyncio"),
    ],
)
def test_the_loop_is_uvloop_only_while_the_guard_runs(
    listen: str | None, asked: str, runs: str
) -> None:
    guard = ProcessSettings(guard_listen=listen, event_loop=asked)
    assert loop_of(guard) == runs

    async def kind() -> int:
        return 1 if type(asyncio.get_running_loop()).__module__.startswith("uvloop") else 0

    assert run(kind(), guard) == (runs == "uvloop")


def test_without_uvloop_auto_falls_back_and_an_explicit_ask_names_the_fix(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "uvloop" else real(name, *a)
    )
    assert loop_of(ProcessSettings(guard_listen=GUARD)) == "asyncio"
    with pytest.raises(SettingsError, match=r"pip install uvloop.*--guard-loop asyncio"):
        loop_of(ProcessSettings(guard_listen=GUARD, event_loop="uvloop"))


def test_an_unknown_loop_is_refused() -> None:
    with pytest.raises(SettingsError, match="--guard-loop 'libuv': choose from auto, uvloop"):
        validate_process(ProcessSettings(event_loop="libuv"))


FRAGMENTED_HEAP = """
import sys
from engine_watchdog.runtime.loop import release_freed_memory
def rss_mb():
    return int(open('/proc/self/statm').read().split()[1]) * 4096 / 2**20
blocks = [bytes(4000) for _ in range(20000)]  # 80 MB from malloc (not Python's small-object heap)
survivors = blocks[::16]  # one in 16 kept: the heap cannot shrink from its top by itself
del blocks
before = rss_mb()
release_freed_memory()
print(before, rss_mb())
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc_trim")
def test_freed_heap_pages_go_back_to_the_system() -> None:
    """What start-up leaves freed but resident (imports compiled from source, NVML's start):
    after release_freed_memory most of it is no longer in the process's RSS."""
    ran = subprocess.run(
        [sys.executable, "-c", FRAGMENTED_HEAP], capture_output=True, text=True, timeout=60
    )
    assert ran.returncode == 0, ran.stderr
    before, after = (float(x) for x in ran.stdout.split())
    assert before - after > 40, (before, after)


CTRL_C = """
import asyncio
from engine_watchdog.cli.main import main
class Interrupting:
    def __set_name__(self, owner, name):
        raise KeyboardInterrupt  # a Ctrl-C while an import makes a class (a dataclass's fields)
def before_the_loop(coroutine, **kw):
    raise KeyboardInterrupt  # a Ctrl-C after the coroutine is made, before the loop takes it
def in_a_class_body(coroutine, **kw):
    coroutine.close()
    class Counters:
        last = Interrupting()
asyncio.run = {where}
main(["watch", "http://127.0.0.1:9"])
"""


@pytest.mark.parametrize("where", ["before_the_loop", "in_a_class_body"])
def test_a_ctrl_c_in_the_windows_of_the_start_ends_quietly_with_130(where: str) -> None:
    """Windows test_stopping's "starting" moment hit now and then: 128+SIGINT (main called as
    a function raises it; the console script ends by SIGINT itself), and nothing on stderr.
    Before the loop took the command's coroutine, Python warned it was never awaited; in a
    class body (3.11), the Ctrl-C came out as RuntimeError ("Error calling __set_name__") and
    exit 70, an internal error."""
    ran = subprocess.run(
        [sys.executable, "-c", CTRL_C.format(where=where)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert (ran.returncode, ran.stderr.strip()) == (128 + signal.SIGINT, "")
