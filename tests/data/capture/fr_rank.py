"""A rank that serves PyTorch's NCCL flight-recorder pipe the way ProcessGroupNCCL does.

Started by the peer tests (its own process group, killed at the end). It makes and holds open
(O_NONBLOCK) ``$TORCH_NCCL_DEBUG_INFO_PIPE_FILE<RANK>.pipe``; on a byte, it writes a dump to
``$TORCH_NCCL_DEBUG_INFO_TEMP_FILE<RANK>`` a moment later, as PyTorch's ``DumpPipe`` and its
watchdog's dump do (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp). Prints "ready" once the
pipe is open. Argument: lifetime seconds.
"""

import os
import sys
import time


def main() -> None:
    rank = os.environ["RANK"]
    pipe = os.environ["TORCH_NCCL_DEBUG_INFO_PIPE_FILE"] + rank + ".pipe"
    dump = os.environ["TORCH_NCCL_DEBUG_INFO_TEMP_FILE"] + rank
    os.mkfifo(pipe)
    fd = os.open(pipe, os.O_RDONLY | os.O_NONBLOCK)
    print("ready", flush=True)
    deadline = time.monotonic() + float(sys.argv[1] if len(sys.argv) > 1 else 60)
    while time.monotonic() < deadline:
        time.sleep(0.1)  # PyTorch's watchdog loop polls the pipe; DumpPipe.shouldDump reads it
        try:
            data = os.read(fd, 128)  # b"" with no writer, EAGAIN with one that wrote nothing
        except BlockingIOError:
            data = b""
        if data:
            time.sleep(0.2)
            with open(dump, "wb") as f:  # a pickle, as the flight recorder writes
                f.write(b"\x80\x02}q\x00(X\x07\x00\x00\x00versionq\x01X\x03\x00\x00\x002.4q\x02u.")


if __name__ == "__main__":
    main()
