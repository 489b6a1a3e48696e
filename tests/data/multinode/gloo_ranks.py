# mypy: ignore-errors
"""Real torch gloo ranks for the multi-node culprit fixtures (README.md), run by the vLLM
venv's python (it has torch; the watchdog's venv has none, hence no type checking here).

``python gloo_ranks.py RANK WORLD PORT FAULT``: every rank joins a gloo group on
127.0.0.1:PORT and loops on all_reduce. FAULT decides what rank 1 does: "none" (all of them
keep reducing), "skip" (rank 1 leaves the loop and sleeps in its own code, so the others wait
in all_reduce for it), "stop" (rank 1 goes on; the recorder SIGSTOPs it from outside),
"barrier" (rank 1 computes outside the collective while the others wait in barrier).
"""

from __future__ import annotations

import os
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def train_step(x: torch.Tensor) -> None:
    dist.all_reduce(x)


def busy_outside_collective(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(i * i for i in range(1000))


def main() -> None:
    rank, world, port, fault = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[4]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    dist.init_process_group("gloo", rank=rank, world_size=world, timeout=timedelta(seconds=600))
    x = torch.ones(1024)
    for step in range(1_000_000):
        if fault == "skip" and rank == 1 and step == 50:
            time.sleep(600)  # rank 1 skips every later all_reduce
        if fault == "barrier" and rank == 1 and step == 50:
            busy_outside_collective(600)
        if fault == "barrier" and step >= 50:
            dist.barrier()
            continue
        train_step(x)


if __name__ == "__main__":
    main()
