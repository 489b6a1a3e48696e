"""A capture target: one thread blocked on a lock in a function with a recognisable name.

Started by the capture tests (its own process group, killed at the end). Prints "ready" once the
worker thread is blocked, then sleeps in the main thread. Arguments: [lifetime seconds [title]];
a title is set with setproctitle, as vLLM names its processes (``VLLM::EngineCore``).
"""

import sys
import threading
import time

LOCK = threading.Lock()


def engine_step_blocked_on_lock() -> None:
    LOCK.acquire()


def main() -> None:
    if len(sys.argv) > 2:
        import setproctitle

        setproctitle.setproctitle(sys.argv[2])
    LOCK.acquire()
    worker = threading.Thread(target=engine_step_blocked_on_lock, name="stuck-worker", daemon=True)
    worker.start()
    time.sleep(0.2)
    print("ready", flush=True)
    deadline = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 300)
    while time.monotonic() < deadline:
        time.sleep(0.5)


if __name__ == "__main__":
    main()
