"""The leader node's engine core in the multi-node simulator: ``python -m
engine_watchdog.sim.shm_broadcast``.

vLLM's multi-node leader runs an ``EngineCore`` process beside its workers; in a hang it waits
for the workers' answers in its shared-memory broadcast queue (``dequeue`` / ``acquire_read``
in ``vllm/distributed/device_communicators/shm_broadcast.py``). This stand-in is titled
``VLLM::EngineCore`` and waits in an ``acquire_read`` of a file named like vLLM's, so a
watchdog sees the engine core a vLLM group has, and its stack reads as a collective wait.
"""

from __future__ import annotations

import argparse
import signal
import threading

from engine_watchdog.sim.engine import _die_with_parent


def acquire_read() -> None:
    """Wait for the workers' results (for good: the workers drive the group here)."""
    threading.Event().wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="engine_watchdog.sim.shm_broadcast")
    parser.add_argument("--parent-pid", type=int, required=True)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    import setproctitle

    setproctitle.setproctitle("VLLM::EngineCore")
    acquire_read()


if __name__ == "__main__":
    main()
