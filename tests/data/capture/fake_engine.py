"""A two-process stand-in for an engine: an "API server" listening on a loopback port and a child
titled ``VLLM::EngineCore`` with a thread blocked on a lock (blocked_target.py).

Prints the port once the child is ready. Started by the capture tests in its own process group,
which they kill at the end; it also exits by itself after the lifetime given as argv[1].
"""

import socket
import subprocess
import sys
import time
from pathlib import Path


def main() -> None:
    lifetime = float(sys.argv[1]) if len(sys.argv) > 1 else 300.0
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    target = Path(__file__).with_name("blocked_target.py")
    child = subprocess.Popen(
        [sys.executable, str(target), str(lifetime), "VLLM::EngineCore"],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None and child.stdout.readline().strip() == "ready"
    print(server.getsockname()[1], flush=True)
    deadline = time.monotonic() + lifetime
    while time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.5)
    child.kill()


if __name__ == "__main__":
    main()
